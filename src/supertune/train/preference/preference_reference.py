"""The reference model's log-probabilities, computed once with the start model before training.

Full fine-tuning changes the weights the reference must keep, so instead of a frozen second copy
of the model (twice the weights in memory) every row's reference log-probabilities are computed
with the start model before the Trainer exists, and kept with the rows
(supertune.training_data.preference_data): one forward pass over the data, no gradients, then
the run holds one model. The start model is built the same way at every start of the run (the
same files, or the same seed for fresh weights); a run keeps the numbers in its directory
(supertune.train.preference.preference_reference_store), and a resumed or requeued run reads them
back when they were computed from the same start model, rows and settings, instead of computing them
again before it loads its checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ...training_data.preference_data import PreferenceRows
from .preference_reference_store import StoredReference, wanted_record
from .preference_scoring import batch_logps

__all__ = ["attach_reference", "reference_logps", "scored_batches"]

log = logging.getLogger("supertune")


def attach_reference(
    model: Any,
    splits: list[PreferenceRows],
    collator: Any,
    batch_size: int,
    device: Any,
    store: StoredReference | None = None,
) -> None:
    """Set `.reference` of each split: the start model's log-probabilities of its rows. With `store`,
    read from there when they were computed from the same start model, rows and settings, else
    computed and written there."""
    started = time.time()
    counts = " and ".join(str(len(rows)) for rows in splits)
    wanted = wanted_record(model, splits, batch_size, device) if store is not None else None
    stored = store.read(wanted) if store is not None and wanted is not None else None
    if stored is not None:
        for rows, values in zip(splits, stored):
            rows.reference = values
        log.info(
            "reference log-probabilities of %s rows read from %s (the same start model, rows and settings; %.1f s)",
            counts,
            store.directory,
            time.time() - started,
        )
        return
    for rows in splits:
        rows.reference = reference_logps(model, rows, collator, batch_size, device)
    log.info(
        "reference log-probabilities of %s rows computed once with the start model (%.1f s)",
        counts,
        time.time() - started,
    )
    if store is not None and wanted is not None:
        store.write(wanted, [rows.reference for rows in splits if rows.reference is not None])


def reference_logps(model: Any, rows: PreferenceRows, collator: Any, batch_size: int, device: Any) -> np.ndarray:
    """Rows x 2 float64: each row's (chosen, rejected) or (answer, KL row) summed answer log-probability."""
    out = np.zeros((len(rows), 2), dtype=np.float64)
    for start, n, batch in scored_batches(model, rows, collator, batch_size, device, drop=("reference",)):
        first = _scored(model, batch, "")
        if rows.paired:
            out[start : start + n, 0], out[start : start + n, 1] = first[:n], first[n:]
        else:
            out[start : start + n, 0] = first
            out[start : start + n, 1] = _scored(model, batch, "kl_")
    return out


def scored_batches(
    model: Any, rows: PreferenceRows, collator: Any, batch_size: int, device: Any, drop: tuple[str, ...] = ()
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(first row, rows, collated batch on `device`) of `rows` in order, `batch_size` at a time, with
    `model` in eval mode and no gradients while they are scored (its mode given back after); `drop`:
    keys of the rows the collator must not see."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                items = [rows[i] for i in range(start, min(start + batch_size, len(rows)))]
                for item in items:
                    for key in drop:
                        item.pop(key, None)
                yield start, len(items), {k: v.to(device) for k, v in collator(items).items()}
    finally:
        model.train(was_training)


def _scored(model: Any, batch: dict[str, Any], prefix: str) -> np.ndarray:
    return batch_logps(model, batch, prefix)[0].double().cpu().numpy()
