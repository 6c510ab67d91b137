"""Cheap checks of the first batch of a split, before the first step: data that would train on
garbage is refused instead, with the column or the tokenizer named.

Two runs that go on without an error otherwise: a template whose column is missing in most rows
trains on the bare template text, and documents the tokenizer encodes into nothing become lone EOS
tokens. Both are seen in the first batch (up to BATCH_DOCS rows), which is rendered and tokenized
anyway: the checks cost a count over it.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np

from ..config.schema import DataConfig
from ..errors import UserError

__all__ = ["check_rows", "check_encoded"]


def check_rows(rows: dict[str, list[Any]], d: DataConfig, split: str) -> None:
    """Refuse a batch of rows in which more than half lack what the documents are made from.

    Without a template: the text column is missing (None: the key absent from a JSON line, an empty
    CSV cell) or not a string; an empty string does not count, blank lines are ordinary. With a
    template: every column it names is missing or blank while the row has other values, so the row
    would become the template's bare text (an empty optional column, like the "input" of
    instruction data, is fine while another of its columns has text).
    """
    n = len(next(iter(rows.values()))) if rows else 0
    if not n:
        return
    if d.template is None:
        values = rows.get(d.text_field, [None] * n)
        missing = sum(not isinstance(v, str) for v in values)
        if 2 * missing > n:
            raise UserError(
                f"data.text_field: {missing} of the first {n} {split} rows have no text in column {d.text_field!r} "
                f"(missing or not a string), and would be dropped; name the column that holds the text"
            )
        return
    fields = [f for _, f, _, _ in string.Formatter().parse(d.template) if f]
    used = [rows.get(f, [None] * n) for f in fields]
    others = [values for name, values in rows.items() if name not in fields]
    # A row blank everywhere is skipped when rendering (render_texts); one with values elsewhere is not.
    bare = sum(all(_blank(c[i]) for c in used) and any(not _blank(c[i]) for c in others) for i in range(n))
    if 2 * bare > n:
        named = ", ".join(f"{{{f}}}" for f in fields)
        raise UserError(
            f"data.template: {named} missing or empty in {bare} of the first {n} {split} rows, which would train on "
            "the template's bare text; fix the data, or the template's column names"
        )


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def check_encoded(texts: int, lengths: np.ndarray, add_eos: bool, split: str) -> None:
    """Refuse a first batch in which more than half of the `texts` rendered documents encode into no
    token (lengths: those of the documents that have one, EOS included when add_eos)."""
    if not texts:
        return
    with_tokens = int(np.count_nonzero(lengths > (1 if add_eos else 0)))
    if 2 * (texts - with_tokens) > texts:
        raise UserError(
            f"model.tokenizer: {texts - with_tokens} of the first {texts} {split} documents encode into no tokens "
            "(each would train as a lone EOS); the tokenizer does not fit this text: give the one the model was trained with"
        )
