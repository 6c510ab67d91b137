"""What a run records while it trains: metrics.jsonl always, TensorBoard when asked."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

__all__ = ["MetricsFile", "tensorboard_callback"]


class MetricsFile(TrainerCallback):
    """Appends every log event (loss, learning rate, eval loss, ...) to <run dir>/metrics.jsonl on the main process."""

    def __init__(self, path: Path, tokens_per_step: int | None) -> None:
        self.path = path
        self.tokens_per_step = tokens_per_step
        self.started = time.time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Time to the first optimizer step is what users wait through on every start; record it once.
        if state.global_step == 1 and state.is_world_process_zero:
            self._append({"event": "first_step", "step": 1, "unix_time": time.time(), "elapsed_s": round(time.time() - self.started, 3)})

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, "elapsed_s": round(time.time() - self.started, 3)}
        record.update(logs)
        if state.num_input_tokens_seen:
            record["tokens_seen"] = int(state.num_input_tokens_seen)
        self._append(record)

    def _append(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def tensorboard_callback(log_dir: Path) -> Any:
    """The Trainer's TensorBoard callback writing under the run directory."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))
