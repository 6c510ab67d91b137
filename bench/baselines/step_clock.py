"""A TrainerCallback that writes when each optimizer step ended and how many tokens the Trainer had seen.

Both baselines use it; the benchmark reads the file it writes. supertune records the same facts in
its own metrics.jsonl, so nothing here is needed there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

__all__ = ["StepClock"]


class StepClock(TrainerCallback):
    """Appends {"step", "unix_time", "tokens_seen"} to a JSON-lines file at the end of every optimizer step."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Take the time first: the file write below belongs to the next interval, not this step.
        now = time.time()
        record = {"step": state.global_step, "unix_time": now, "tokens_seen": int(state.num_input_tokens_seen)}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
