"""Resuming a run: which checkpoint (agreed on by every rank), and which config changes a resumed
run may bring (resources and bookkeeping, not what decides the numbers)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ...checkpoints.layout import CheckpointDir
from ...checkpoints.manifest import CheckpointManifest
from ...config.schema import RunConfig

__all__ = ["choose_checkpoint", "config_differences", "CHANGEABLE_ON_RESUME"]

log = logging.getLogger("supertune")

# Keys (or whole sections) a resumed run may change. Everything else decides the model, the data
# order or the optimisation, so the resumed run would no longer continue the same run.
CHANGEABLE_ON_RESUME = (
    "launch.",
    "slurm.",
    "generate.",
    "output.save_model",
    "output.progress_seconds",
    "training.max_steps",
    "training.num_train_epochs",
    "training.eval_strategy",
    "training.eval_steps",
    "training.save_strategy",
    "training.save_steps",
    "training.save_total_limit",
    "training.logging_steps",
    "training.report_to",
    "training.mlflow_tracking_uri",
    "training.ddp_timeout",
    "training.dataloader_num_workers",
)


def config_differences(saved: RunConfig, new: RunConfig) -> list[str]:
    """'key: saved -> new' for every setting that differs and may not change on resume."""
    before, after = _flat(dataclasses.asdict(saved)), _flat(dataclasses.asdict(new))
    changeable = CHANGEABLE_ON_RESUME
    if (
        saved.training.global_batch_size is not None
        and saved.training.global_batch_size == new.training.global_batch_size
    ):
        # Derived from the global batch for the process count (which may change): the step stays the same.
        changeable += ("training.per_device_train_batch_size", "training.gradient_accumulation_steps")
    return [
        f"{key}: {before.get(key)!r} -> {after.get(key)!r}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key) and not key.startswith(changeable)
    ]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "config_overrides":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def choose_checkpoint(layout: CheckpointDir, is_main: bool, world_size: int) -> tuple[Path, CheckpointManifest] | None:
    """The checkpoint to resume from, the same on every rank: the main process clears unfinished
    saves and checks the candidates (sizes and sha256), then tells the others."""
    from accelerate.utils import broadcast_object_list

    choice: list[Any] = [None]
    if is_main:
        layout.clear_staging()
        found = layout.resumable()
        if found is not None:
            path, manifest = found
            choice[0] = (str(path), dataclasses.asdict(manifest))
    if world_size > 1:
        broadcast_object_list(choice)
    if choice[0] is None:
        return None
    path, manifest = choice[0]
    return Path(path), CheckpointManifest(**manifest)
