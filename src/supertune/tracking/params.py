"""What a run logs as its parameters: the resolved config flattened to dotted keys, and the launch
as the training process found it (which may differ from what the config asked)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config.schema import RunConfig
from ..launch.environment import LaunchEnvironment
from ..rundir import RunDir

__all__ = ["SINKS", "flat_config", "launch_params", "numeric", "tracked_name"]

SINKS = ("wandb", "mlflow")
"""The tracking backends of training.report_to (besides tensorboard)."""


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """Every key of the resolved config as `section.key: value` (lists and mappings as they are)."""
    out: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and prefix != "model.config_overrides.":
            for key, inner in value.items():
                walk(inner, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = value

    walk(dataclasses.asdict(cfg), "")
    return out


def launch_params(cfg: RunConfig, env: LaunchEnvironment, devices: str) -> dict[str, Any]:
    """The launch of this start of the run: nodes, processes and who started them, the strategy."""
    return {
        "launched.nodes": env.num_nodes,
        "launched.processes": env.world_size,
        "launched.started_by": env.launcher,
        "launched.launcher": cfg.launch.launcher,
        "launched.strategy": cfg.distributed.strategy,
        "launched.cluster": cfg.launch.cluster,
        "launched.devices": devices,
    }


def tracked_name(cfg: RunConfig, run: RunDir) -> str:
    """The tracked run's name: its directory's, or in a group (a federation's site and round, whose
    directories are all named `run`) its output.name."""
    return cfg.output.name if cfg.training.tracking_group else run.path.name


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a log record or summary (no booleans, no text, no NaN or infinity): what a
    tracking backend can plot."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value == value and abs(value) != float("inf"):
            out[key] = float(value)
    return out
