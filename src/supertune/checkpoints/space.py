"""Free space before a save: a checkpoint that cannot fit is refused before its first byte, so a
full disk never leaves half a checkpoint behind and the previous ones stay usable."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

__all__ = ["expected_checkpoint_bytes", "space_problem"]

# Adam keeps two fp32 moments per trainable parameter; the scheduler, RNG and trainer state are small.
_OPTIMIZER_BYTES_PER_TRAINABLE = 8
_SMALL_FILES = 1 << 20
# Room left over: file systems report free blocks before their own metadata needs.
_MARGIN = 1.05


def expected_checkpoint_bytes(previous_total: int | None, model: Any) -> int:
    """The size of the next checkpoint: the previous one's, or an estimate from the model before the first."""
    if previous_total:
        return previous_total
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return weights + trainable * _OPTIMIZER_BYTES_PER_TRAINABLE + _SMALL_FILES


def space_problem(directory: Path, needed: int, step: int, keep: int | None) -> str | None:
    """None when `needed` bytes fit in `directory`'s file system; else the message that stops the run."""
    free = shutil.disk_usage(directory).free
    if free >= needed * _MARGIN:
        return None
    limit = f"lower training.save_total_limit (now {keep})" if keep else "set training.save_total_limit"
    return (
        f"checkpoint at step {step} needs about {_human(needed)}, but {directory} has only {_human(free)} free; "
        f"the run stopped before writing it (earlier checkpoints are intact): free space or {limit}, then run the same command again to resume"
    )


def _human(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TB"
