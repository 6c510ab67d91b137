"""A reference point for language-model quality: the perplexity of a unigram model.

A trained model that does not beat this has learned nothing beyond token frequencies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["unigram_perplexity", "unigram_perplexity_from_counts"]


def _flatten(seqs: Iterable[Sequence[int]]) -> np.ndarray:
    arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def unigram_perplexity(train_ids: Iterable[Sequence[int]], eval_ids: Iterable[Sequence[int]], vocab_size: int) -> float:
    """Perplexity on ``eval_ids`` of an add-one-smoothed unigram model counted on ``train_ids``.

    p(t) = (count(t) + 1) / (N + vocab_size), where N is the number of training tokens; the
    result is exp of the mean negative log-probability over all evaluation tokens.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    train = _flatten(train_ids)
    evaluation = _flatten(eval_ids)
    if evaluation.size == 0:
        raise ValueError("eval_ids holds no tokens")
    for name, ids in (("train_ids", train), ("eval_ids", evaluation)):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"{name} has ids outside [0, {vocab_size})")
    return unigram_perplexity_from_counts(
        np.bincount(train, minlength=vocab_size), np.bincount(evaluation, minlength=vocab_size)
    )


def unigram_perplexity_from_counts(train_counts: np.ndarray, eval_counts: np.ndarray) -> float:
    """The same perplexity from per-token-id counts (length = vocabulary size), for callers that
    count while streaming tokens and never hold them all."""
    train = np.asarray(train_counts, dtype=np.float64)
    evaluation = np.asarray(eval_counts, dtype=np.float64)
    log_p = np.log(train + 1.0) - math.log(train.sum() + len(train))
    return float(np.exp(-(evaluation * log_p).sum() / evaluation.sum()))
