"""Exact per-token evaluation loss, the same on one process or many.

The Trainer's evaluate() averages per-batch means and, with several processes, counts the samples
that pad the last batches; its number then depends on the batch size and the process count. This
loop sums token losses and token counts instead: each rank takes every world-th sequence, ranks
that run short feed a batch whose labels are all ignored (so sharded models still see the same
number of forward calls everywhere), and one all-reduce adds the sums.
"""

from __future__ import annotations

import math
from typing import Any

from ..checkpoints.faults import fault_point
from .placement import input_device

__all__ = ["token_mean_loss"]

IGNORE_INDEX = -100


def token_mean_loss(model: Any, dataset: Any, collator: Any, batch_size: int) -> tuple[float, int]:
    """(mean next-token cross-entropy over every labelled token, number of such tokens)."""
    import torch
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    indices = list(range(rank, len(dataset), world))
    batches = math.ceil(math.ceil(len(dataset) / world) / batch_size)
    device = input_device(model)
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b in range(batches):
                features = [dataset[i] for i in indices[b * batch_size : (b + 1) * batch_size]]
                if not features:
                    features = [_ignored(dataset[0])]
                batch = {k: v.to(device) for k, v in collator(features).items()}
                labels = batch.pop("labels", batch["input_ids"])
                logits = model(**batch).logits[:, :-1].float()
                target = labels[:, 1:]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
                )
                sums[0] += loss.double()
                sums[1] += (target != IGNORE_INDEX).sum()
                fault_point("evaluate.batch", b + 1, rank)
    finally:
        model.train(was_training)
    if distributed:
        dist.all_reduce(sums)
    count = int(sums[1].item())
    return (sums[0] / max(count, 1)).item(), count


def _ignored(feature: dict[str, Any]) -> dict[str, Any]:
    """A copy of a sequence that contributes nothing to the loss."""
    out = dict(feature)
    out["labels"] = feature["input_ids"].new_full(feature["input_ids"].shape, IGNORE_INDEX)
    return out
