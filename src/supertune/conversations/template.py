"""Which chat template renders a run's conversations, put on the tokenizer so the final model saves it.

data.chat_template (a file) wins; else the tokenizer's own; else, for the tokenizers supertune
trains itself (the embedded default, model.tokenizer=train), the embedded template. Whatever is
chosen is set as the tokenizer's `chat_template`, which `save_pretrained` writes beside it: plain
transformers' `apply_chat_template` on the saved model then renders what the run trained on.

Before a run starts, the template is tried on a conversation of two user and two assistant turns: one that fails,
or whose assistant turns cannot be found (supertune.conversations.spans), is refused then, not at
the first row.
"""

from __future__ import annotations

import os
from typing import Any

from ..config.schema import DataConfig
from ..errors import UserError
from .spans import RowProblem, assistant_spans, render

__all__ = ["attach_chat_template"]

# No system turn: some templates (Gemma's, strict Mistral ones) refuse one, and rows that have it
# are checked one by one anyway.
_PROBE = [
    {"role": "user", "content": "Where is the mill?"},
    {"role": "assistant", "content": "The mill is north of the town."},
    {"role": "user", "content": "And the bridge?"},
    {"role": "assistant", "content": "The bridge is south of the town."},
]


def attach_chat_template(d: DataConfig, tokenizer: Any, source: str, own_tokenizer: bool) -> None:
    """Set the run's chat template on `tokenizer` (loaded from `source`) and try it; a UserError if none fits.

    own_tokenizer: the tokenizer is one supertune trained (the embedded one or model.tokenizer=train),
    which has no template of its own and gets the embedded one.
    """
    if d.chat_template:
        path = os.path.expanduser(d.chat_template)
        try:
            with open(path, encoding="utf-8") as f:
                tokenizer.chat_template = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"data.chat_template: cannot read {d.chat_template!r}: {exc}") from None
    elif not getattr(tokenizer, "chat_template", None):
        if not own_tokenizer:
            raise UserError(
                f"data.chat_template: the tokenizer of {source!r} has no chat template; give one as a Jinja file "
                "(data.chat_template=FILE), e.g. the template of the model family it was trained as"
            )
        from ..embedded import EMBEDDED_CHAT_TEMPLATE

        tokenizer.chat_template = EMBEDDED_CHAT_TEMPLATE
    try:
        if d.loss_target == "all":  # every token is trained: the template only has to render
            render(tokenizer, _PROBE, False)
            return
        _, spans = assistant_spans(tokenizer, _PROBE)
    except RowProblem as problem:
        raise UserError(f"{problem.key}: on a sample conversation: {problem.message}") from None
    if len(spans) != 2:
        raise UserError(
            "data.chat_template: on a sample conversation with two assistant turns it renders "
            f"{len(spans)} answers; give a template that writes every assistant turn, or data.loss_on=all"
        )
