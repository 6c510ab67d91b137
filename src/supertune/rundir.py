"""The run directory: the unit of reproducibility (resolved config, metrics, checkpoints, model, summary)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .errors import UserError

__all__ = ["RunDir", "create_run_dir", "holds_run", "write_json_atomic"]

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
STOP_REQUEST_FILE = "stop-request"
"""Created (by the job script, or by `supertune train` for its workers) to ask a run to checkpoint and stop."""
STOPPED_FILE = "stopped.json"
"""Written by the main process when a run stopped on request after saving its checkpoint."""


class RunDir:
    """Names of the files in a run directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def stop_request(self) -> Path:
        return self.path / STOP_REQUEST_FILE

    @property
    def stopped(self) -> Path:
        return self.path / STOPPED_FILE

    @property
    def model(self) -> Path:
        return self.path / "model"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"


def holds_run(path: Path) -> bool:
    """Whether `path` is the directory of a run (it has the run's config.yaml)."""
    return (Path(path).expanduser() / CONFIG_FILE).is_file()


def create_run_dir(explicit: str | None, name: str, runs_root: str, config_text: str) -> RunDir:
    """Create the run directory and write the resolved config into it; never reuse a directory holding a run."""
    if explicit:
        path = Path(explicit).expanduser().absolute()
        if (path / CONFIG_FILE).exists():
            raise UserError(f"--run-dir: {str(path)!r} already holds a run (config.yaml); choose a new directory")
        if path.exists() and not path.is_dir():
            raise UserError(f"--run-dir: {str(path)!r} exists and is not a directory")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(runs_root).expanduser().absolute() / f"{name}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = path.with_name(f"{name}-{stamp}-{suffix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--run-dir: cannot create {str(path)!r}: {exc.strerror}") from None
    run = RunDir(path)
    run.config.write_text(config_text, encoding="utf-8")
    return run


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
