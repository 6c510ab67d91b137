"""What a run records while it trains: metrics.jsonl always, TensorBoard when asked."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

__all__ = ["MetricsFile", "append_event", "tensorboard_callback"]


def append_event(path: Path, record: dict[str, Any]) -> None:
    """Append one record to a metrics.jsonl file."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), or None where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


class MetricsFile(TrainerCallback):
    """Appends every log event (loss, learning rate, eval loss, ...) to <run dir>/metrics.jsonl on the main process."""

    def __init__(self, path: Path, tokens_per_step: int | None) -> None:
        self.path = path
        self.tokens_per_step = tokens_per_step
        self.started = time.time()
        self.first_step_seen = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Time to the first optimizer step is what users wait through on every start (and restart
        # after a resume); record it once per process, also counted from the process's start.
        if not self.first_step_seen and state.is_world_process_zero:
            self.first_step_seen = True
            age = process_age_s()
            self._append(
                {
                    "event": "first_step",
                    "step": state.global_step,
                    "unix_time": time.time(),
                    "elapsed_s": round(time.time() - self.started, 3),
                    "since_process_start_s": round(age, 3) if age is not None else None,
                }
            )

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, "elapsed_s": round(time.time() - self.started, 3)}
        record.update(logs)
        if state.num_input_tokens_seen:
            record["tokens_seen"] = int(state.num_input_tokens_seen)
        self._append(record)

    def _append(self, record: dict[str, Any]) -> None:
        append_event(self.path, record)


def tensorboard_callback(log_dir: Path) -> Any:
    """The Trainer's TensorBoard callback writing under the run directory."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))


def publish_scores(run: Any, tracking: Any, step: int, scores: dict[str, float]) -> None:
    """Benchmark scores (bench/<task>/<metric>) into metrics.jsonl and the tracking sinks, at `step`;
    main process only. Not through Trainer.log: after training, its TensorBoard writer is closed."""
    append_event(run.metrics, {"step": step, **scores})
    tracking.log(step, scores)
