"""training.global_batch_size keeps every optimizer step at exactly that many sequences.

An epoch whose sequences are not a whole number of global batches ends in a partial step, and that
step differs with the process count: one process trains the remainder as it is, several processes
are topped up with repeated sequences by the data loader (accelerate's even batches). So the
training split is cut to whole global batches, in the dataset's own order, before the sampler
shuffles it. Costs at most global_batch_size - 1 sequences per epoch, the same ones each epoch
(the last in the split's order), which the log says. A stream has no length and is left as it is:
streamed runs stop at training.max_steps.
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import UserError

__all__ = ["whole_global_batches"]

log = logging.getLogger("supertune")


def whole_global_batches(train: Any, global_batch: int | None) -> Any:
    """`train`, cut to a multiple of `global_batch` sequences (unchanged when that is not set or it is a stream)."""
    if global_batch is None or not hasattr(train, "__len__") or not hasattr(train, "__getitem__"):
        return train
    total = len(train)
    kept = total - total % global_batch
    if kept == total:
        return train
    if kept == 0:
        raise UserError(
            f"training.global_batch_size: the training split has {total} sequences, fewer than one global batch of "
            f"{global_batch}; lower training.global_batch_size or add data"
        )
    from torch.utils.data import Subset

    log.info(
        "training.global_batch_size: %d training sequences make %d steps of %d per epoch; the last %d are left out, "
        "so that every step has the same %d at any process count",
        total,
        kept // global_batch,
        global_batch,
        total - kept,
        global_batch,
    )
    return Subset(train, range(kept))
