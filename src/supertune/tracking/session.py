"""The tracking sinks of one training process, and the Trainer callback that feeds them.

Only the main process (rank 0) has sinks; the others get an empty Tracking, which costs nothing.
A sink that fails (not installed, server unreachable, disk full) says so once, as a warning, and is
dropped: training goes on, and metrics.jsonl still has every record.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from ..config.schema import RunConfig
from ..errors import first_line
from ..launch.environment import LaunchEnvironment, slurm_allocation
from ..rundir import RunDir
from .ids import read_ids, write_ids
from .params import SINKS, flat_config, launch_params, numeric

__all__ = ["SINKS", "Tracking", "TrackingCallback"]

log = logging.getLogger("supertune")


def _sink_class(name: str) -> Any:
    if name == "wandb":
        from .wandb_sink import WandbSink

        return WandbSink
    from .mlflow_sink import MlflowSink

    return MlflowSink


def _pinned(name: str) -> str:
    """The requirement the project is tested with, from pinned-requirements.txt."""
    from ..container.pins import read_pins

    return next((p.requirement for p in read_pins() if p.key == name), name)


class Tracking:
    """The sinks of a run: log(step, record) for every log record, close(...) once at the end."""

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks
        self.callback = TrackingCallback(self)
        self.step = 0

    @classmethod
    def for_run(cls, cfg: RunConfig, run: RunDir, env: LaunchEnvironment, devices: str) -> Tracking:
        """Start the sinks that training.report_to names, continuing the run's tracked runs when
        tracking.json has their ids (a resume or a requeue)."""
        wanted = [s for s in dict.fromkeys(cfg.training.report_to) if s in SINKS]
        if not env.is_main or not wanted:
            return cls([])
        ids = read_ids(run.tracking)
        params = {**flat_config(cfg), **launch_params(cfg, env, devices)}
        tags = {"supertune.run_dir": str(run.path.absolute())}
        if cfg.training.tracking_group:
            tags["supertune.group"] = cfg.training.tracking_group
        allocation = slurm_allocation()
        if allocation is not None:
            tags["supertune.slurm_job_id"] = allocation.job_id  # a requeue keeps the id; another submission does not
        sinks = []
        for name in wanted:
            try:
                sinks.append(_sink_class(name).start(cfg, run, ids, params, tags))
            except ImportError as exc:
                log.warning(
                    "training.report_to: %s is not installed here (%s): install %s (pinned-requirements.txt); "
                    "the run goes on and metrics.jsonl has every metric",
                    name, first_line(exc), _pinned(name),
                )  # fmt: skip
            except Exception as exc:  # whatever the library raises: the backend must not end the training
                _warn_off(name, "could not start", exc)
        try:
            write_ids(run.tracking, ids)
        except OSError as exc:
            log.warning("%s cannot be written (%s): a resumed run will start new tracked runs", run.tracking, exc)
        for sink in sinks:
            log.info("tracking: %s", sink.describe())
        return cls(sinks)

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.step = step
        metrics = numeric(record)
        if metrics:
            self._each("log", step, metrics)

    def close(self, outcome: str, step: int | None = None, summary: dict[str, Any] | None = None) -> None:
        """outcome: finished (with the run's summary), stopped (checkpointed on request, to be
        resumed) or failed. The sinks are closed and dropped: a second close does nothing."""
        self._each("close", self.step if step is None else step, summary, outcome)
        self.sinks = []

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # a backend's failure must not end the training
                _warn_off(sink.name, "stopped logging", exc)
                self.sinks.remove(sink)


def _warn_off(name: str, what: str, exc: BaseException) -> None:
    log.warning(
        "training.report_to: %s %s (%s: %s); it is off for the rest of this run, which goes on: "
        "metrics.jsonl has every metric",
        name, what, type(exc).__name__, first_line(exc)[:300],
    )  # fmt: skip


class TrackingCallback(TrainerCallback):
    """Every log record of the main process (losses, the throughput and MFU figures that
    telemetry's ThroughputFields added, evaluations) to the sinks; register it after ThroughputFields."""

    def __init__(self, tracking: Tracking) -> None:
        self.tracking = tracking

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or not self.tracking.sinks:
            return
        record = dict(logs)
        if state.num_input_tokens_seen:
            record["tokens_seen"] = int(state.num_input_tokens_seen)
        self.tracking.log(state.global_step, record)
