"""MLflow: one MLflow run per supertune run, in the store that training.mlflow_tracking_uri,
MLFLOW_TRACKING_URI or (by default) the run directory names.

The client is MLflow's `MlflowClient` on an explicit run id rather than the Trainer's MLflowCallback
or `mlflow.start_run`: the callback logs the Trainer's arguments instead of supertune's config,
starts a new MLflow run on every resume and keeps its run in process-wide state; with the id in
tracking.json a requeued job continues the same run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..checkpoints.manifest import MODEL_MANIFEST_FILE
from ..config.schema import RunConfig
from ..rundir import RunDir
from .ids import TrackingIds
from .params import numeric, tracked_name

__all__ = ["MlflowSink", "default_tracking_uri", "tracking_uri"]

# MLflow's own defaults wait 120 s per request and retry 7 times with backoff: minutes of a stalled
# training when the server is unreachable. A few seconds and one retry bound the cost to about 11 s,
# once: the first failure turns the sink off. A user's own setting of these variables wins.
SHORT_TIMEOUTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
PARAMS_PER_REQUEST = 100  # MLflow's limit on parameters in one log_batch
PARAM_VALUE_CHARS = 6000  # and on one parameter's value
OUTCOME_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


def default_tracking_uri(run: RunDir) -> str:
    """A SQLite store inside the run directory: MLflow 3 refuses its plain-file store, and one file
    that only rank 0 writes is safe on a cluster's shared filesystem."""
    return f"sqlite:///{run.mlflow / 'mlflow.db'}"


def tracking_uri(cfg: RunConfig, run: RunDir) -> str:
    return cfg.training.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(run)


class MlflowSink:
    name = "mlflow"

    def __init__(self, client: Any, run_id: str, run: RunDir, uri: str) -> None:
        self.client = client
        self.run_id = run_id
        self.run = run
        self.uri = uri

    def describe(self) -> str:
        return f"MLflow run {self.run_id} at {self.uri}"

    @classmethod
    def start(
        cls, cfg: RunConfig, run: RunDir, ids: TrackingIds, params: dict[str, Any], tags: dict[str, str]
    ) -> MlflowSink:
        for key, value in SHORT_TIMEOUTS.items():
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient

        uri = tracking_uri(cfg, run)
        local = uri == default_tracking_uri(run)
        if local:
            run.mlflow.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=uri)
        run_id = _existing_run(client, ids, uri)
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.training.tracking_project or cfg.output.name
            experiment_id = _experiment(client, name, uri)
            run_id = client.create_run(experiment_id, run_name=tracked_name(cfg, run), tags=tags).info.run_id
            ids.mlflow_run_id, ids.mlflow_tracking_uri = run_id, uri
            logged: dict[str, str] = {}
        else:
            client.update_run(run_id, status="RUNNING")
            for key, value in tags.items():
                client.set_tag(run_id, key, value)
            logged = client.get_run(run_id).data.params
        sink = cls(client, run_id, run, uri)
        sink._log_params(params, logged)
        return sink

    def _log_params(self, params: dict[str, Any], logged: dict[str, str]) -> None:
        """Parameters are write-once in MLflow: a resumed run adds the new ones and records in a tag
        the ones it changed (launch and bookkeeping keys, which resume allows to change)."""
        from mlflow.entities import Param

        values = {k: str(v)[:PARAM_VALUE_CHARS] for k, v in params.items()}
        new = [Param(k, v) for k, v in values.items() if k not in logged]
        for i in range(0, len(new), PARAMS_PER_REQUEST):
            self.client.log_batch(self.run_id, params=new[i : i + PARAMS_PER_REQUEST], synchronous=True)
        changed = [f"{k}: {logged[k]} -> {v}" for k, v in values.items() if k in logged and logged[k] != v]
        if changed:
            self.client.set_tag(self.run_id, "supertune.changed_on_resume", "; ".join(changed)[:PARAM_VALUE_CHARS])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, step: int, summary: dict[str, Any] | None, outcome: str) -> None:
        from mlflow.entities import Metric

        if summary is not None:
            now = int(time.time() * 1000)
            metrics = [Metric(f"summary/{k}", v, now, step) for k, v in numeric(summary).items()]
            self.client.log_batch(self.run_id, metrics=metrics)
            self.client.log_dict(self.run_id, summary, "summary.json")
            self._artifact(self.run.config)
            self._artifact(self.run.model / MODEL_MANIFEST_FILE, "model")
        self.client.set_terminated(self.run_id, OUTCOME_STATUS[outcome])

    def _artifact(self, path: Path, folder: str | None = None) -> None:
        if path.is_file():
            self.client.log_artifact(self.run_id, str(path), folder)


def _existing_run(client: Any, ids: TrackingIds, uri: str) -> str | None:
    """The run id recorded for this store, when the store still has it."""
    if ids.mlflow_run_id is None or ids.mlflow_tracking_uri != uri:
        return None
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(ids.mlflow_run_id)
    except MlflowException:
        return None  # the store was replaced or the run deleted: a new run, recorded anew
    return ids.mlflow_run_id


def _experiment(client: Any, name: str, uri: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    artifacts = _artifact_location(uri)
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name, artifact_location=artifacts)
    except MlflowException:
        # The runs of a sweep start together: another one may have created it since.
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _artifact_location(uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite store's database (the run directory's
    own, or a federation's), since MLflow's default for one is ./mlruns under whatever directory the
    command ran in; a server or a file store decides for itself (None)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return (Path(uri[len(prefix) :]).resolve().parent / "artifacts").as_uri()
