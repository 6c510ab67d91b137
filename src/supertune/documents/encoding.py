"""From raw rows to token ids: the prompt template, then the fast tokenizer in batches.

A document longer than CHUNK_CHARS characters (a book, or a minified file on one line) is
tokenized a piece at a time, so that memory follows the piece and not the document: the tokenizer
holds some 80 bytes per character of its input while it works (offsets, token strings), 4 GB for
one 50 MB line. The pieces are cut just before whitespace where encoding a window around the cut
whole and in two parts gives the same ids; for byte-level BPE (GPT-2, Llama 3, Qwen, the embedded
tokenizer) and for Metaspace pre-tokenizers that is every such cut, so the document's ids are
exactly those of encoding it whole. A tokenizer that merges across whitespace (a normalizer that
prepends to every input) may differ in a token next to a cut, one in CHUNK_CHARS characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

import numpy as np

from ..config.schema import DataConfig

__all__ = [
    "BATCH_DOCS",
    "CHUNK_CHARS",
    "batch_ids",
    "encode_flat",
    "encode_texts",
    "flatten_ids",
    "iter_row_batches",
    "iter_texts",
    "plain_backend",
    "render_texts",
]

# Documents per call to the tokenizer: large enough for its Rust threads to stay busy, small
# enough that the Python lists it returns stay a few MB.
BATCH_DOCS = 2000
CHUNK_CHARS = 1 << 18
"""Longer documents are tokenized in pieces of at most this many characters. 8 M characters of one
line took 2.3 s in pieces of 256 Ki and 4.4 s in pieces of 1 Mi, with 0 and 117 MB more peak memory."""
_CUT_SEARCH = 4096  # characters searched back from a piece's end for a clean cut
_CUT_CHECK = 256  # characters each side of a cut encoded whole and in two parts
_CUT_TRIES = 8


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
        return [
            np.array(x + [eos], dtype=np.int32) if isinstance(x, list) else np.append(x, np.int32(eos)) for x in ids
        ]
    return [np.asarray(x, dtype=np.int32) for x in ids]


def encode_flat(texts: list[str], tokenizer: Any, add_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ids encode_texts gives, as one concatenated int32 array and the (positive) document lengths.

    What a token store writes. One numpy conversion per batch instead of one per document: half the
    Python time per token of building a small array per document and concatenating them.
    """
    if not texts:
        return flatten_ids([], None)
    return flatten_ids(_token_ids(texts, tokenizer), tokenizer.eos_token_id if add_eos else None)


def flatten_ids(ids: list[list[int] | np.ndarray], eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Documents' ids as one int32 array (eos after each document when given) and their positive lengths."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if any(isinstance(x, np.ndarray) for x in ids):  # a long document's pieces (batch_ids)
        flat = np.concatenate([np.asarray(x, dtype=np.int32) for x in ids]) if ids else np.zeros(0, dtype=np.int32)
    else:
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    if eos is not None:
        flat = np.insert(flat, np.cumsum(lengths), eos)
        lengths += 1
    return flat, lengths[lengths > 0]  # a document without tokens is no document


def _token_ids(texts: list[str], tokenizer: Any) -> list[list[int] | np.ndarray]:
    """The ids `tokenizer(texts, add_special_tokens=False)` gives, straight from the Rust backend when that is the same.

    The transformers call also computes offsets and builds Python encodings for every text; the
    backend's encode_batch_fast skips both, which makes tokenizing (most of a run's data
    preparation) about twice as fast. The first text is checked against the ordinary call, so a
    tokenizer that encodes differently still gets the ordinary path.
    """
    backend = plain_backend(tokenizer, texts[0])
    if backend is not None:
        return batch_ids(texts, lambda xs: [e.ids for e in backend.encode_batch_fast(xs, add_special_tokens=False)])
    return batch_ids(
        texts, lambda xs: tokenizer(xs, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    )


def batch_ids(texts: list[str], encode: Callable[[list[str]], list[list[int]]]) -> list[list[int] | np.ndarray]:
    """encode(texts), except that a text longer than CHUNK_CHARS is encoded a piece at a time (see the
    module docstring) into an int32 array; the others go to `encode` together, as lists."""
    if all(len(t) <= CHUNK_CHARS for t in texts):
        return encode(texts)
    short = [t for t in texts if len(t) <= CHUNK_CHARS]
    short_ids = iter(encode(short) if short else [])
    return [next(short_ids) if len(t) <= CHUNK_CHARS else _long_text_ids(t, encode) for t in texts]


def _long_text_ids(text: str, encode: Callable[[list[str]], list[list[int]]]) -> np.ndarray:
    parts = []
    start = 0
    while start < len(text):
        end = len(text) if len(text) - start <= CHUNK_CHARS else _cut(text, start + CHUNK_CHARS, encode)
        parts.append(np.asarray(encode([text[start:end]])[0], dtype=np.int32))
        start = end
    return np.concatenate(parts)


def _cut(text: str, limit: int, encode: Callable[[list[str]], list[list[int]]]) -> int:
    """Where to end the piece that may reach `limit`: before the last whitespace that follows a
    non-space character, if encoding a window around it whole gives the ids of its two halves;
    else the next candidate to the left; `limit` itself when none of a few passes."""
    lowest = limit - _CUT_SEARCH
    i = limit
    for _ in range(_CUT_TRIES):
        i = next((j for j in range(i - 1, lowest, -1) if text[j].isspace() and not text[j - 1].isspace()), lowest)
        if i <= lowest:
            break
        left, right = text[i - _CUT_CHECK : i], text[i : i + _CUT_CHECK]
        whole, a, b = encode([left + right, left, right])
        if list(whole) == list(a) + list(b):
            return i
    return limit


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
        or bool(getattr(backend, "encode_special_tokens", False))
        != bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return None
    sample = sample[:4096]  # a prefix says as much, and a long document would cost the full encoding twice
    same = (
        backend.encode_batch_fast([sample], add_special_tokens=False)[0].ids
        == tokenizer(sample, add_special_tokens=False)["input_ids"]
    )
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
