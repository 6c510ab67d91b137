"""Experiment tracking: a run's config, launch, metrics and summary in Weights & Biases and MLflow.

- `session`: `Tracking`, the sinks of one training process (rank 0 only) and its Trainer callback.
- `wandb_sink`, `mlflow_sink`: one sink each; offline first (W&B writes into the run directory,
  MLflow by default into a SQLite store there).
- `ids`: the tracked run ids kept in <run dir>/tracking.json, so that a resumed run logs into the
  same tracked run.
- `params`: what a run logs as its parameters (the resolved config flattened, the launch).
- `sync`: the offline W&B runs of run directories, uploaded later by `wandb sync`.

Importing this package imports neither wandb, mlflow nor transformers (`supertune sync` stays
light); `session` imports transformers, and a sink imports its library when it starts.
"""

from .ids import TrackingIds, read_ids, write_ids
from .params import flat_config, launch_params
from .sync import offline_wandb_runs, sync_command

__all__ = [
    "TrackingIds",
    "flat_config",
    "launch_params",
    "offline_wandb_runs",
    "read_ids",
    "sync_command",
    "write_ids",
]
