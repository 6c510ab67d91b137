"""From raw rows to token ids: the prompt template, then the fast tokenizer in batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..config.schema import DataConfig

__all__ = ["BATCH_DOCS", "encode_texts", "iter_row_batches", "iter_texts", "render_texts"]

# Documents per call to the tokenizer: large enough for its Rust threads to stay busy, small
# enough that the Python lists it returns stay a few MB.
BATCH_DOCS = 2000


def render_texts(rows: dict[str, list[Any]], d: DataConfig) -> list[str]:
    """The documents of a batch of rows, after the template; rows without text are dropped."""
    if d.template is None:
        texts = rows[d.text_field]
        return [t for t in texts if isinstance(t, str) and t.strip()]
    n = len(next(iter(rows.values()))) if rows else 0
    out = []
    for i in range(n):
        values = {k: v[i] for k, v in rows.items()}
        if all(v is None or (isinstance(v, str) and not v.strip()) for v in values.values()):
            continue
        out.append(d.template.format_map({k: "" if v is None else v for k, v in values.items()}))
    return out


def encode_texts(texts: list[str], tokenizer: Any, add_eos: bool) -> list[np.ndarray]:
    """Token ids of each text (int32), with EOS appended when asked; no BOS and no padding."""
    if not texts:
        return []
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    eos = tokenizer.eos_token_id
    if add_eos:
        return [np.array(x + [eos], dtype=np.int32) for x in ids]
    return [np.array(x, dtype=np.int32) for x in ids]


def iter_row_batches(dataset: Any, batch_docs: int = BATCH_DOCS) -> Iterator[dict[str, list[Any]]]:
    """Rows of a map-style or iterable dataset in column-major batches."""
    if hasattr(dataset, "__len__") and hasattr(dataset, "select"):
        for start in range(0, len(dataset), batch_docs):
            yield dataset[start : start + batch_docs]
        return
    batch: dict[str, list[Any]] = {}
    count = 0
    for row in dataset:
        for k, v in row.items():
            batch.setdefault(k, []).append(v)
        count += 1
        if count == batch_docs:
            yield batch
            batch, count = {}, 0
    if count:
        yield batch


def iter_texts(dataset: Any, d: DataConfig) -> Iterable[str]:
    """Every rendered document of a dataset, for tokenizer training."""
    for rows in iter_row_batches(dataset):
        yield from render_texts(rows, d)
