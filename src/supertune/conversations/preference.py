"""Preference rows, in TRL's formats, turned into token ids and answer masks.

- A pair (training.objective dpo, orpo, simpo): {prompt, chosen, rejected}. Plain text: the prompt
  and each answer are tokenized apart and joined (EOS, data.add_eos, ends the answer), as
  prompt/completion rows are. Conversations: chosen and rejected are lists of {role, content}
  turns ending on the assistant's answer; the prompt is the prompt column (a list of turns, or a
  string taken as one user turn), or, when there is none, the turns the two conversations share
  before their answers. Each side is rendered with the run's chat template; the answer is what
  the template writes after the prompt with its generation prompt (supertune.conversations.spans).
- An unpaired row (training.objective kto): {prompt, completion, label}, the completion in either
  form, label true for a desirable answer and false for an undesirable one.

The mask holds 1 on the answer's tokens: the loss and every log-probability are over them alone.
A bad row stops the run before its first step with its number and the fix, as other rows do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.schema import DataConfig
from ..errors import UserError
from .spans import RowProblem, render

__all__ = ["EncodedAnswer", "encode_pairs", "encode_unpaired"]


@dataclass(frozen=True)
class EncodedAnswer:
    """A prompt and one answer: int32 ids and a uint8 mask, 1 on the answer's tokens."""

    ids: np.ndarray
    mask: np.ndarray


def encode_pairs(
    rows: dict[str, list[Any]], d: DataConfig, tokenizer: Any, where: str, first_row: int
) -> list[tuple[EncodedAnswer, EncodedAnswer]]:
    """(chosen, rejected) of each row of a batch; rows are numbered from `first_row` of `where` in errors."""
    n = len(next(iter(rows.values()))) if rows else 0
    prompts = rows.get(d.prompt_field, [None] * n)
    out = []
    for i, (prompt, chosen, rejected) in enumerate(zip(prompts, rows[d.chosen_field], rows[d.rejected_field])):
        try:
            out.append(_pair(prompt, chosen, rejected, d, tokenizer))
        except RowProblem as problem:
            raise _row_error(problem, first_row + i, where) from None
    return out


def encode_unpaired(
    rows: dict[str, list[Any]], d: DataConfig, tokenizer: Any, where: str, first_row: int
) -> list[tuple[EncodedAnswer, bool]]:
    """(answer, desirable) of each row of a batch."""
    n = len(next(iter(rows.values()))) if rows else 0
    prompts = rows.get(d.prompt_field, [None] * n)
    out = []
    for i, (prompt, completion, label) in enumerate(zip(prompts, rows[d.completion_field], rows[d.label_field])):
        try:
            if not isinstance(label, (bool, np.bool_)) and label not in (0, 1):
                raise RowProblem(
                    "data.label_field",
                    f"label {label!r} is not true or false (desirable or not); fix the row or drop it",
                )
            turns, answer = _sides(prompt, completion, "data.completion_field")
            out.append((_encode(prompt, turns, answer, d, tokenizer, "data.completion_field"), bool(label)))
        except RowProblem as problem:
            raise _row_error(problem, first_row + i, where) from None
    return out


def _row_error(problem: RowProblem, row: int, where: str) -> UserError:
    return UserError(f"{problem.key}: row {row} of {where} (counting from 0): {problem.message}")


def _pair(
    prompt: Any, chosen: Any, rejected: Any, d: DataConfig, tokenizer: Any
) -> tuple[EncodedAnswer, EncodedAnswer]:
    chosen_turns, chosen_answer = _sides(prompt, chosen, "data.chosen_field")
    rejected_turns, rejected_answer = _sides(prompt, rejected, "data.rejected_field")
    if chosen_turns != rejected_turns:
        raise RowProblem(
            "data.prompt_field",
            "the chosen and rejected conversations differ before their answers, so they share no prompt; "
            "give both the same turns before the last one (or a prompt column and the answers alone)",
        )
    if chosen_answer == rejected_answer:
        raise RowProblem(
            "data.rejected_field",
            "the chosen and rejected answers are the same, so there is nothing to prefer; fix the row or drop it",
        )
    return (
        _encode(prompt, chosen_turns, chosen_answer, d, tokenizer, "data.chosen_field"),
        _encode(prompt, rejected_turns, rejected_answer, d, tokenizer, "data.rejected_field"),
    )


def _sides(prompt: Any, answer: Any, key: str) -> tuple[list[dict[str, Any]] | None, Any]:
    """(the prompt's turns, or None for plain text; the answer: text, or the answer turn)."""
    column = key.removeprefix("data.").removesuffix("_field")
    if isinstance(answer, str):
        if not isinstance(prompt, str):
            raise RowProblem(
                "data.prompt_field",
                f"the {column} answer is plain text but the row has no prompt text; give a prompt column, "
                "or write the row as conversations",
            )
        if not answer.strip():
            raise RowProblem(key, f"the {column} answer is empty, so nothing to train on; fix the row or drop it")
        return None, answer
    if not isinstance(answer, list) or not answer or not all(isinstance(t, dict) for t in answer):
        raise RowProblem(
            key, f"the {column} column holds neither text nor a conversation of {{role, content}} turns; fix the row"
        )
    last = answer[-1]
    if last.get("role") != "assistant":
        raise RowProblem(
            key,
            f"the {column} conversation ends on a {last.get('role')!r} turn, not the assistant's answer; fix the row",
        )
    if not isinstance(last.get("content"), str) or not last["content"].strip():
        raise RowProblem(key, f"the {column} answer is empty, so nothing to train on; fix the row or drop it")
    before = [dict(t) for t in answer[:-1]]
    if prompt is None:
        return before, last
    given = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not isinstance(given, list) or not given:
        raise RowProblem("data.prompt_field", "the prompt is neither text nor a list of {role, content} turns")
    if before and before != list(given):
        raise RowProblem(
            "data.prompt_field",
            f"the {column} conversation does not start with the row's prompt; give the answer alone or the prompt's turns first",
        )
    return [dict(t) for t in given], last


def _encode(
    prompt: Any, turns: list[dict[str, Any]] | None, answer: Any, d: DataConfig, tokenizer: Any, key: str
) -> EncodedAnswer:
    if turns is None:
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tail = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if not tail:
            raise RowProblem(key, "the answer encodes into no tokens; fix the row or drop it")
        tail = tail + ([tokenizer.eos_token_id] if d.add_eos else [])
        mask = np.concatenate([np.zeros(len(head), np.uint8), np.ones(len(tail), np.uint8)])
        return EncodedAnswer(np.asarray(head + tail, dtype=np.int32), mask)
    if not getattr(tokenizer, "chat_template", None):
        raise RowProblem(
            "data.chat_template",
            "the row is a conversation but the tokenizer has no chat template; give one (data.chat_template=FILE)",
        )
    before = render(tokenizer, turns, True) if turns else ""
    text = render(tokenizer, [*turns, answer], False)
    if not text.startswith(before) or len(text) == len(before):
        raise RowProblem(
            "data.chat_template",
            "the chat template does not render the answer after the prompt it renders alone, so the answer cannot "
            "be found; give a template that renders a conversation turn after turn",
        )
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.asarray([s for s, _ in encoded["offset_mapping"]], dtype=np.int64)
    mask = (starts >= len(before)).astype(np.uint8)
    if not mask.any():
        raise RowProblem(key, "the answer renders into no tokens; fix the row or drop it")
    return EncodedAnswer(np.asarray(encoded["input_ids"], dtype=np.int32), mask)
