"""Where the assistant's answers are in a rendered conversation.

A chat template is a Jinja program, not a format supertune can parse, so the answers are found by
rendering: for the assistant turn i, the conversation's first i turns with the generation prompt
end where the answer starts, and its first i + 1 turns end where it ends. That holds for every
template that renders a conversation turn after turn (Llama 3, Qwen 2.5, Mistral's, ChatML, the
embedded one) and needs no markers in the template; the cost is two more renderings per assistant
turn, microseconds each next to tokenizing. A template that renders a turn differently once more
turns follow (one that moves the system prompt into the last user turn, or drops earlier turns'
reasoning) breaks the prefix rule and is refused: its answers cannot be found this way, and
training on whatever were found would train on the wrong tokens.

The character spans become token masks through the tokenizer's offsets: a token is in the loss when
it starts inside a span, which takes in the end-of-turn marker the template writes after the
answer (the token the model must learn to stop on).
"""

from __future__ import annotations

from typing import Any

__all__ = ["KNOWN_ROLES", "RowProblem", "assistant_spans", "conversation_problem", "render"]

# Roles the common templates know; anything else is a typo or a dataset in another schema.
KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool", "ipython", "function")


class RowProblem(Exception):
    """What is wrong with one row: (the config key to blame, what is wrong and the fix)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def conversation_problem(messages: Any, field: str) -> RowProblem | None:
    """Why `messages` is not a conversation supertune can train on (None: it is)."""
    key = "data.messages_field"
    if not isinstance(messages, list) or not messages:
        return RowProblem(
            key,
            f"column {field!r} holds no conversation ({type(messages).__name__}); give a list of {{role, content}} turns",
        )
    for turn in messages:
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str):
            return RowProblem(
                key, f"a turn of column {field!r} is not a {{role, content}} mapping; fix the row or drop it"
            )
        if turn["role"] not in KNOWN_ROLES:
            return RowProblem(
                key, f"unknown role {turn['role']!r} (known: {', '.join(KNOWN_ROLES)}); rename the role or drop the row"
            )
    last = messages[-1]["role"]
    if last != "assistant":
        return RowProblem(
            key,
            f"the conversation ends on a {last} turn, which has no answer to train on; end it on an assistant turn or drop the row",
        )
    return None


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # jinja2's TemplateError, or an exception the template raises itself
        raise RowProblem(
            "data.chat_template",
            f"the chat template fails on it: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; fix the row or the template",
        ) from None


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it (see the module)."""
    text = render(tokenizer, messages, False)
    spans = []
    for i, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], True) if i else ""
        through = text if i == len(messages) - 1 else render(tokenizer, messages[: i + 1], False)
        if not (text.startswith(through) and through.startswith(before)):
            raise RowProblem(
                "data.chat_template",
                f"the chat template renders turn {i} (counting from 0) differently once later turns follow, so its assistant turns "
                "cannot be marked; give a template that renders a conversation turn after turn (data.chat_template=FILE), "
                "or train on every token (data.loss_on=all)",
            )
        if len(through) > len(before):
            spans.append((len(before), len(through)))
    return text, spans
