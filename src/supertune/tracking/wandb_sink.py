"""Weights & Biases: one W&B run per supertune run, written offline into the run directory
(<run dir>/wandb/offline-run-*) unless WANDB_MODE says otherwise; `supertune sync` uploads it later.

supertune calls `wandb.init` itself rather than the Trainer's WandbCallback: the callback logs the
Trainer's arguments instead of supertune's config, reads its run id only from WANDB_RUN_ID, and
starts its run on the first train step, where a failure ends the training. Here the run id is made
and kept in tracking.json before `wandb.init`, so a requeued job resumes the same W&B run, and every
call is guarded by the session (supertune.tracking.session).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from ..checkpoints.manifest import MODEL_MANIFEST_FILE
from ..config.schema import RunConfig
from ..rundir import RunDir
from .ids import TrackingIds, write_ids
from .params import tracked_name

__all__ = ["WandbSink"]

# Compute nodes have no way out: offline unless the user chose (WANDB_MODE=online on a node that
# can reach the server, or disabled).
DEFAULT_MODE = "offline"
# Online, wandb waits 90 s for its server by default; a training start should not.
INIT_TIMEOUT_S = 30.0
EXIT_CODES = {"finished": 0, "stopped": 75, "failed": 1}
MANIFEST_KEY = "model_manifest"
"""The summary key of the saved model's manifest (model/supertune-model.json), as MLflow's artifact."""

log = logging.getLogger("supertune")


class WandbSink:
    name = "wandb"

    def __init__(self, wandb_run: Any, run: RunDir) -> None:
        self.wandb_run = wandb_run
        self.run = run

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
        """`tags` (the run directory, the SLURM job) join the run config, as MLflow's tags; W&B records
        the program, its arguments and the host in the run's metadata itself."""
        os.environ.setdefault("WANDB_MODE", DEFAULT_MODE)
        import wandb

        if ids.wandb_run_id is None:
            ids.wandb_run_id = uuid.uuid4().hex[:12]  # W&B's own form: lowercase letters and digits
            write_ids(run.tracking, ids)  # before init: a job killed during it resumes the same id
        wandb_run = wandb.init(
            dir=str(run.path),
            project=os.environ.get("WANDB_PROJECT") or cfg.training.tracking_project or cfg.output.name,
            name=tracked_name(cfg, run),
            group=cfg.training.tracking_group or None,
            id=ids.wandb_run_id,
            resume="allow",
            config={**params, **tags},
            settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S, console="off", silent=True),
        )
        return cls(wandb_run, run)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.wandb_run.log(metrics, step=step)

    def close(self, step: int, summary: dict[str, Any] | None, outcome: str) -> None:
        if summary is not None:
            # The whole summary (text too: the model, the FLOP formula, the sample) as the run's summary.
            self.wandb_run.summary.update({k: v for k, v in summary.items() if v is not None})
            self._files(summary)
        self.wandb_run.finish(exit_code=EXIT_CODES[outcome])

    def _files(self, summary: dict[str, Any]) -> None:
        """What MLflow gets as artifacts: summary.json, config.yaml and the model's manifest, as files
        of the W&B run (copied into its folder, so that `wandb sync` uploads them from there), and
        the manifest in the summary too, where W&B's tables show it."""
        files = Path(self.wandb_run.dir)
        (files / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
        names = ["summary.json"]
        manifest = self.run.model / MODEL_MANIFEST_FILE
        for source, name in ((self.run.config, "config.yaml"), (manifest, f"model/{MODEL_MANIFEST_FILE}")):
            if source.is_file():
                (files / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, files / name)
                names.append(name)
        if manifest.is_file():
            try:
                self.wandb_run.summary.update({MANIFEST_KEY: json.loads(manifest.read_text(encoding="utf-8"))})
            except ValueError as exc:  # the model was checked when saved; a damaged copy only costs this entry
                log.warning("%s cannot be read (%s): the W&B summary goes without it", manifest, exc)
        for name in names:
            self.wandb_run.save(str(files / name), base_path=str(files), policy="now")
