"""Weights & Biases: one W&B run per supertune run, written offline into the run directory
(<run dir>/wandb/offline-run-*) unless WANDB_MODE says otherwise; `supertune sync` uploads it later.

supertune calls `wandb.init` itself rather than the Trainer's WandbCallback: the callback logs the
Trainer's arguments instead of supertune's config, reads its run id only from WANDB_RUN_ID, and
starts its run on the first train step, where a failure ends the training. Here the run id is made
and kept in tracking.json before `wandb.init`, so a requeued job resumes the same W&B run, and every
call is guarded by the session (supertune.tracking.session).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from ..config.schema import RunConfig
from ..rundir import RunDir
from .ids import TrackingIds, write_ids

__all__ = ["WandbSink"]

# Compute nodes have no way out: offline unless the user chose (WANDB_MODE=online on a node that
# can reach the server, or disabled).
DEFAULT_MODE = "offline"
# Online, wandb waits 90 s for its server by default; a training start should not.
INIT_TIMEOUT_S = 30.0
EXIT_CODES = {"finished": 0, "stopped": 75, "failed": 1}


class WandbSink:
    name = "wandb"

    def __init__(self, wandb_run: Any) -> None:
        self.wandb_run = wandb_run

    def describe(self) -> str:
        mode = os.environ.get("WANDB_MODE", DEFAULT_MODE)
        if mode == "disabled":
            return "W&B is off (WANDB_MODE=disabled)"
        where = "`supertune sync RUN` uploads it" if mode == "offline" else "mode " + mode
        return f"W&B run {self.wandb_run.id} in {Path(self.wandb_run.dir).parent} ({where})"

    @classmethod
    def start(
        cls, cfg: RunConfig, run: RunDir, ids: TrackingIds, params: dict[str, Any], tags: dict[str, str]
    ) -> WandbSink:
        """`tags` (the run directory, the SLURM job) go to MLflow; W&B records the program, its arguments
        and its directory in the run's metadata itself."""
        os.environ.setdefault("WANDB_MODE", DEFAULT_MODE)
        import wandb

        if ids.wandb_run_id is None:
            ids.wandb_run_id = uuid.uuid4().hex[:12]  # W&B's own form: lowercase letters and digits
            write_ids(run.tracking, ids)  # before init: a job killed during it resumes the same id
        wandb_run = wandb.init(
            dir=str(run.path),
            project=os.environ.get("WANDB_PROJECT") or cfg.output.name,
            name=run.path.name,
            id=ids.wandb_run_id,
            resume="allow",
            config=params,
            settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S, console="off", silent=True),
        )
        return cls(wandb_run)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.wandb_run.log(metrics, step=step)

    def close(self, step: int, summary: dict[str, Any] | None, outcome: str) -> None:
        if summary is not None:
            # The whole summary (text too: the model, the FLOP formula, the sample) as the run's summary.
            self.wandb_run.summary.update({k: v for k, v in summary.items() if v is not None})
        self.wandb_run.finish(exit_code=EXIT_CODES[outcome])
