"""From raw rows to token ids: the prompt template, then the fast tokenizer in batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import numpy as np

from ..config.schema import DataConfig

__all__ = ["BATCH_DOCS", "encode_flat", "encode_texts", "flatten_ids", "iter_row_batches", "iter_texts", "plain_backend", "render_texts"]

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
    ids = _token_ids(texts, tokenizer)
    eos = tokenizer.eos_token_id
    if add_eos:
        return [np.array(x + [eos], dtype=np.int32) for x in ids]
    return [np.array(x, dtype=np.int32) for x in ids]


def encode_flat(texts: list[str], tokenizer: Any, add_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ids encode_texts gives, as one concatenated int32 array and the (positive) document lengths.

    What a token store writes. One numpy conversion per batch instead of one per document: half the
    Python time per token of building a small array per document and concatenating them.
    """
    if not texts:
        return flatten_ids([], None)
    return flatten_ids(_token_ids(texts, tokenizer), tokenizer.eos_token_id if add_eos else None)


def flatten_ids(ids: list[list[int]], eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Documents' ids as one int32 array (eos after each document when given) and their positive lengths."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    if eos is not None:
        flat = np.insert(flat, np.cumsum(lengths), eos)
        lengths += 1
    return flat, lengths[lengths > 0]  # a document without tokens is no document


def _token_ids(texts: list[str], tokenizer: Any) -> list[list[int]]:
    """The ids `tokenizer(texts, add_special_tokens=False)` gives, straight from the Rust backend when that is the same.

    The transformers call also computes offsets and builds Python encodings for every text; the
    backend's encode_batch_fast skips both, which makes tokenizing (most of a run's data
    preparation) about twice as fast. The first text is checked against the ordinary call, so a
    tokenizer that encodes differently still gets the ordinary path.
    """
    backend = plain_backend(tokenizer, texts[0])
    if backend is not None:
        return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]


def plain_backend(tokenizer: Any, sample: str) -> Any | None:
    """The tokenizers.Tokenizer behind a transformers fast tokenizer whose call adds nothing in Python, else None.

    transformers switches the backend's own truncation and padding off for each call, sets
    encode_special_tokens from split_special_tokens, and lets some tokenizer classes rewrite the
    text or the ids in Python; the backend alone is only used when none of that applies and its
    ids for `sample` are those of the ordinary call.
    """
    try:
        from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
    except ImportError:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cls = type(tokenizer)
    if (
        backend is None
        or not hasattr(backend, "encode_batch_fast")
        or not isinstance(tokenizer, PreTrainedTokenizerFast)
        or cls.__call__ is not PreTrainedTokenizerBase.__call__
        or getattr(cls, "_encode_plus", None) is not getattr(PreTrainedTokenizerFast, "_encode_plus", None)
        or hasattr(tokenizer, "_switch_to_input_mode")
        or backend.truncation is not None
        or backend.padding is not None
        or bool(getattr(backend, "encode_special_tokens", False)) != bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return None
    same = backend.encode_batch_fast([sample], add_special_tokens=False)[0].ids == tokenizer(sample, add_special_tokens=False)["input_ids"]
    return backend if same else None


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
