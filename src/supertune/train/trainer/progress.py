"""Training progress for a reader: tqdm's bar on a terminal, a plain line every few seconds elsewhere.

A job log is a file: a progress bar there is one endless line of carriage returns. So without a
terminal the Trainer's bar is switched off (TrainingArguments.disable_tqdm) and this callback writes
`step/steps, loss, tokens/s, ETA` every output.progress_seconds instead, as `supertune prepare` does.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from transformers import TrainerCallback

__all__ = ["ProgressLines", "progress_bar_wanted"]

log = logging.getLogger("supertune")


def progress_bar_wanted() -> bool:
    """Whether a progress bar can be drawn: stderr (where tqdm writes) is a terminal."""
    return sys.stderr.isatty()


class ProgressLines(TrainerCallback):
    """One log line every `interval_s` seconds, and one when training ends (main process only)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.loss: float | None = None
        self.started = self.last = 0.0
        self.first_step = 0
        self.first_tokens = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After a resume, rates and the ETA count only this process's steps.
        self.started = self.last = time.monotonic()
        self.first_step = int(state.global_step)
        self.first_tokens = int(state.num_input_tokens_seen or 0)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.loss = float(logs["loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.last = now
            self._line(state, now)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._line(state, time.monotonic())

    def _line(self, state: Any, now: float) -> None:
        if not state.is_world_process_zero:
            return
        step, total = int(state.global_step), int(state.max_steps or 0)
        elapsed = max(now - self.started, 1e-9)
        done = step - self.first_step
        parts = [f"step {step}/{total}" + (f" ({100 * step / total:.0f}%)" if total else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        tokens = int(state.num_input_tokens_seen or 0) - self.first_tokens
        parts.append(f"{tokens / elapsed:,.0f} tokens/s")
        parts.append(f"elapsed {_clock(elapsed)}")
        if done > 0 and total > step:
            parts.append(f"ETA {_clock(elapsed / done * (total - step))}")
        log.info("progress: %s", ", ".join(parts))


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
