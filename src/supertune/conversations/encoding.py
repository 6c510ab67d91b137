"""Rows of conversations or prompt/completion pairs turned into token ids and loss masks.

A mask holds 1 where the token is a target of the loss (data.loss_on) and 0 elsewhere; the datasets
of supertune.training_data turn the zeros into label -100. Every row is checked as it is encoded,
and the first bad one stops the run before its first step with its number and the fix.

- chat: the conversation rendered by the tokenizer's chat template (attached by
  supertune.conversations.template) and tokenized whole with offsets; the template writes its own
  BOS and end-of-turn markers, so data.add_eos appends nothing.
- prompt_completion: the prompt and the completion tokenized apart and joined, so that the prompt
  has the ids it has when it is given alone to `supertune generate`; EOS (data.add_eos) ends the
  completion and is trained, so the model learns to stop. Each is read from its column, or written
  from the row's columns by data.prompt_template / data.completion_template.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config.schema import DataConfig
from ..errors import UserError
from .spans import RowProblem, assistant_spans, conversation_problem, render

__all__ = ["check_rows", "encode_rows"]


def encode_rows(
    rows: dict[str, list[Any]], d: DataConfig, tokenizer: Any, where: str, first_row: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ids, masks) of a batch of rows, int32 ids and uint8 masks; rows are numbered from `first_row`
    of `where` ("the training split") in the error a bad row raises."""
    n = len(next(iter(rows.values()))) if rows else 0
    try:
        if d.format == "chat":
            return _conversations(rows.get(d.messages_field, [None] * n), d, tokenizer, first_row)
        _check_prompt_completions(rows, d, first_row, n)
        return _prompt_completions(rows, d, tokenizer, first_row, n)
    except _BadRow as bad:
        raise _row_error(bad, where) from None


def check_rows(rows: dict[str, list[Any]], d: DataConfig, where: str, first_row: int) -> None:
    """What encode_rows checks without a tokenizer: the shape of every conversation (roles, the last
    turn) or the text of every prompt and completion."""
    n = len(next(iter(rows.values()))) if rows else 0
    try:
        if d.format == "chat":
            for i, messages in enumerate(rows.get(d.messages_field, [None] * n)):
                problem = conversation_problem(messages, d.messages_field)
                if problem is not None:
                    raise _BadRow(first_row + i, problem)
        else:
            _check_prompt_completions(rows, d, first_row, n)
    except _BadRow as bad:
        raise _row_error(bad, where) from None


def _row_error(bad: _BadRow, where: str) -> UserError:
    return UserError(f"{bad.problem.key}: row {bad.row} of {where} (counting from 0): {bad.problem.message}")


class _BadRow(Exception):
    def __init__(self, row: int, problem: RowProblem) -> None:
        self.row = row
        self.problem = problem


def _conversations(
    conversations: list[Any], d: DataConfig, tokenizer: Any, first_row: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    texts, spans = [], []
    for i, messages in enumerate(conversations):
        try:
            problem = conversation_problem(messages, d.messages_field)
            if problem is not None:
                raise problem
            if d.loss_target == "all":
                texts.append(render(tokenizer, messages, False))
                spans.append(None)
            else:
                text, found = assistant_spans(tokenizer, messages)
                texts.append(text)
                spans.append(found)
        except RowProblem as problem:
            raise _BadRow(first_row + i, problem) from None
    if not texts:
        return [], []
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    ids_out, masks_out = [], []
    for i, (ids, offsets, found) in enumerate(zip(encoded["input_ids"], encoded["offset_mapping"], spans)):
        ids = np.asarray(ids, dtype=np.int32)
        if found is None:
            mask = np.ones(len(ids), dtype=np.uint8)
        else:
            starts = np.asarray([s for s, _ in offsets], dtype=np.int64)
            mask = np.zeros(len(ids), dtype=np.uint8)
            for lo, hi in found:
                mask[(starts >= lo) & (starts < hi)] = 1
            if not mask.any():
                raise _BadRow(
                    first_row + i,
                    RowProblem(
                        "data.chat_template",
                        "the chat template renders no answer tokens for its assistant turns (empty answers, or a "
                        "template that drops them); fix the row or give a template that writes the answers",
                    ),
                )
        ids_out.append(ids)
        masks_out.append(mask)
    return ids_out, masks_out


def _part(rows: dict[str, list[Any]], template: str | None, field: str, n: int) -> list[Any]:
    """One part of each row: its column, or the template written from the row's columns (a column
    the row lacks, or holds None, writes as empty text)."""
    if template is None:
        return rows.get(field, [None] * n)
    return [template.format_map({k: "" if v[i] is None else v[i] for k, v in rows.items()}) for i in range(n)]


def _check_prompt_completions(rows: dict[str, list[Any]], d: DataConfig, first_row: int, n: int) -> None:
    prompts = _part(rows, d.prompt_template, d.prompt_field, n)
    completions = _part(rows, d.completion_template, d.completion_field, n)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if not isinstance(p, str):
            raise _BadRow(
                first_row + i,
                RowProblem("data.prompt_field", f"no prompt text in column {d.prompt_field!r}; fix the row or drop it"),
            )
        if not isinstance(c, str) or not c.strip():
            where = (
                f"data.completion_template writes empty text for this row ({d.completion_template!r})"
                if d.completion_template is not None
                else f"no completion text in column {d.completion_field!r}"
            )
            key = "data.completion_template" if d.completion_template is not None else "data.completion_field"
            raise _BadRow(first_row + i, RowProblem(key, f"{where}, so nothing to train on; fix the row or drop it"))


def _prompt_completions(
    rows: dict[str, list[Any]], d: DataConfig, tokenizer: Any, first_row: int, n: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    prompts = _part(rows, d.prompt_template, d.prompt_field, n)
    completions = _part(rows, d.completion_template, d.completion_field, n)
    if not n:
        return [], []
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False, return_attention_mask=False)["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False, return_attention_mask=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if d.add_eos else []
    prompt_trained = 0 if d.loss_target == "completion" else 1
    ids_out, masks_out = [], []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not c:
            raise _BadRow(
                first_row + i,
                RowProblem("data.completion_field", "the completion encodes into no tokens; fix the row or drop it"),
            )
        ids_out.append(np.asarray(p + c + eos, dtype=np.int32))
        mask = np.ones(len(p) + len(c) + len(eos), dtype=np.uint8)
        mask[: len(p)] = prompt_trained
        masks_out.append(mask)
    return ids_out, masks_out
