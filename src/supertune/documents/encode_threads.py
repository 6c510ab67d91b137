"""Tokenizing a stream of batches on every core: one whole batch per thread, results in order.

The fast tokenizer parallelizes inside each batch call (Rayon) and hands back Python lists that the
caller then turns into numpy ids on one core while the other cores wait. Here each thread encodes a
whole batch with the tokenizer's own threads switched off and converts its ids itself:
`encode_batch_fast` releases the GIL, so the threads encode in parallel and one thread's GIL-held
ids-to-numpy work overlaps the others' encoding. On 2 cores, 4.96 M tokens of wikitext-2 in
batches of 2,000 took 2.42 s this way against 2.55 s batch after batch on the tokenizer's own
threads (medians of 4, same process); most of what is left is the tokenizer itself.

Only a tokenizer whose backend alone gives the ids the transformers call gives is encoded this way
(`plain_backend`), so no thread ever changes the backend's settings under another one.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from itertools import chain
from typing import Any, TypeVar

import numpy as np

from .encoding import batch_ids, encode_flat, flatten_ids, plain_backend

__all__ = ["encode_in_threads", "usable_cores"]

T = TypeVar("T")
_PARALLELISM = "TOKENIZERS_PARALLELISM"


def usable_cores() -> int:
    """Cores this process may run on (a SLURM task's own share, not the node's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def encode_in_threads(
    items: Iterable[tuple[T, list[str]]], tokenizer: Any, add_eos: bool, threads: int | None = None
) -> Iterator[tuple[T, np.ndarray, np.ndarray]]:
    """(tag, concatenated ids, document lengths) of each (tag, texts), in the order given; as encode_flat."""
    threads = threads or usable_cores()
    iterator = iter(items)
    first: list[tuple[T, list[str]]] = []
    for tag, texts in iterator:  # the first text decides how every batch is encoded
        first.append((tag, texts))
        if texts:
            break
    backend = plain_backend(tokenizer, first[-1][1][0]) if first and first[-1][1] else None
    if backend is None or threads < 2:
        for tag, texts in chain(first, iterator):
            yield (tag, *encode_flat(texts, tokenizer, add_eos))
        return
    eos = tokenizer.eos_token_id if add_eos else None

    def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = (
            batch_ids(texts, lambda xs: [e.ids for e in backend.encode_batch_fast(xs, add_special_tokens=False)])
            if texts
            else []
        )
        return flatten_ids(ids, eos)

    # Two batches in flight per thread keep every thread busy while the caller consumes the oldest
    # result; more would only hold more Python lists in memory.
    pending: deque[tuple[T, Future]] = deque()
    with _tokenizer_threads_off(), ThreadPoolExecutor(threads, thread_name_prefix="encode") as pool:
        for tag, texts in chain(first, iterator):
            pending.append((tag, pool.submit(encode, texts)))
            if len(pending) >= 2 * threads:
                oldest, future = pending.popleft()
                yield (oldest, *future.result())
        while pending:
            oldest, future = pending.popleft()
            yield (oldest, *future.result())


@contextmanager
def _tokenizer_threads_off() -> Iterator[None]:
    """The tokenizers library reads TOKENIZERS_PARALLELISM at every batch call; off while our threads run, then as it was."""
    before = os.environ.get(_PARALLELISM)
    os.environ[_PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_PARALLELISM, None)
        else:
            os.environ[_PARALLELISM] = before
