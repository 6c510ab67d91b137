"""Uploading offline W&B runs: the offline-run folders of run directories, handed to `wandb sync`
(from a login node, or wherever the W&B server can be reached)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from ..rundir import RunDir

__all__ = ["federation_runs", "offline_wandb_runs", "sync_command"]


def offline_wandb_runs(run: RunDir) -> list[Path]:
    """The run's offline W&B folders, oldest first: one per start of the training (a requeued or
    resumed run has several, all of one W&B run id, which `wandb sync` uploads in this order)."""
    return sorted(p for p in run.wandb.glob("offline-run-*") if p.is_dir() and any(p.glob("run-*.wandb")))


def federation_runs(path: Path) -> list[RunDir] | None:
    """A federation directory's tracked runs with offline W&B folders: its global series (the
    directory itself, first) and its sites' runs of every round; None when `path` is no federation."""
    if not (path / "federation.yaml").is_file():
        return None
    sites = [RunDir(p) for p in sorted(path.glob("round-*/*/run")) if offline_wandb_runs(RunDir(p))]
    return [RunDir(path), *sites]


def sync_command(runs: list[RunDir], dry_run: bool = False) -> list[str]:
    """`wandb sync` of every offline W&B run of `runs`; a run directory without one is refused
    (all such named in one error) before anything is uploaded."""
    folders, problems = [], []
    for run in runs:
        found = offline_wandb_runs(run)
        if not found:
            problems.append(str(run.path))
        folders += found
    if problems:
        raise UserError(
            f"RUN: no offline W&B run in {', '.join(problems)} (no wandb/offline-run-*/run-*.wandb): "
            "only a run trained with training.report_to: [wandb] in offline mode has one"
        )
    return [sys.executable, "-m", "wandb", "sync", *(["--dry-run"] if dry_run else []), *map(str, folders)]
