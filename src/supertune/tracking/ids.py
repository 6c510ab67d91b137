"""The ids of a run's tracked runs, kept in <run dir>/tracking.json: a requeued or resumed run
reads them back and logs into the same W&B run and the same MLflow run."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..rundir import write_json_atomic

__all__ = ["TrackingIds", "read_ids", "write_ids"]

log = logging.getLogger("supertune")


@dataclass
class TrackingIds:
    wandb_run_id: str | None = None
    mlflow_run_id: str | None = None
    mlflow_tracking_uri: str | None = None
    """The store the MLflow run id belongs to: under another URI the id means nothing."""


def read_ids(path: Path) -> TrackingIds:
    """The ids a run recorded; none for a new run. A damaged file costs the link to the earlier
    tracked runs (a warning), never the training."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return TrackingIds()
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): this run starts new tracked runs", path, exc)
        return TrackingIds()
    fields = {f.name for f in dataclasses.fields(TrackingIds)}
    if not isinstance(data, dict):
        log.warning("%s is not a JSON object: this run starts new tracked runs", path)
        return TrackingIds()
    return TrackingIds(**{k: v for k, v in data.items() if k in fields and isinstance(v, str)})


def write_ids(path: Path, ids: TrackingIds) -> None:
    write_json_atomic(path, {k: v for k, v in dataclasses.asdict(ids).items() if v is not None})
