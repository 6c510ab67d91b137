"""From per-step records to the benchmark's numbers, the same way for every arm.

An arm's record is, per optimizer step, the wall-clock time the step ended and the running count
of non-pad input tokens (the Trainer's num_input_tokens_seen with "non_padding").

- time to first step: process spawn (the harness's clock) to the end of step 1. It holds imports,
  data loading and preparation, model construction, Trainer set-up and step 1 itself;
- effective throughput: non-pad tokens of steps 2..N over the time from the end of step 1 to the
  end of step N: steady training only, with every one-off cost left in the start-up number.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StepRecord", "ArmMeasurement", "measure", "read_step_clock", "read_supertune_metrics"]


@dataclass(frozen=True)
class StepRecord:
    step: int
    unix_time: float
    tokens_seen: int


@dataclass(frozen=True)
class ArmMeasurement:
    """The numbers of one arm in one round."""

    steps: int
    time_to_first_step_s: float
    steady_time_s: float
    steady_tokens: int
    tokens_per_second: float
    """Effective (non-pad) tokens per second over steps 2..N."""
    slot_tokens_per_second: float
    """All token slots (pads included) per second over steps 2..N: the compute the arm actually does."""
    padding_fraction: float
    """Pad slots / all slots in steps 2..N."""
    median_step_s: float


def measure(
    records: list[StepRecord], spawn_time: float, batch_size: int, seq_len: int, first_step_end: float | None = None
) -> ArmMeasurement:
    """The arm's numbers; every sequence an arm feeds is exactly seq_len long, so slots = steps x batch x seq_len.

    first_step_end, when given, is the arm's own record of when step 1 ended (supertune's
    first_step event); otherwise step 1's record is used.
    """
    records = sorted(records, key=lambda r: r.step)
    if len(records) < 3 or records[0].step != 1:
        raise ValueError(f"need steps 1..N (N >= 3) with times, got steps {[r.step for r in records][:5]}...")
    first, last = records[0], records[-1]
    steady_time = last.unix_time - first.unix_time
    steady_tokens = last.tokens_seen - first.tokens_seen
    slots = (last.step - first.step) * batch_size * seq_len
    durations = [b.unix_time - a.unix_time for a, b in zip(records, records[1:])]
    return ArmMeasurement(
        steps=last.step,
        time_to_first_step_s=(first.unix_time if first_step_end is None else first_step_end) - spawn_time,
        steady_time_s=steady_time,
        steady_tokens=steady_tokens,
        tokens_per_second=steady_tokens / steady_time,
        slot_tokens_per_second=slots / steady_time,
        padding_fraction=1.0 - steady_tokens / slots,
        median_step_s=statistics.median(durations),
    )


def read_step_clock(path: Path) -> list[StepRecord]:
    """The baselines' steps.jsonl (bench/baselines/step_clock.py)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out.append(StepRecord(int(r["step"]), float(r["unix_time"]), int(r["tokens_seen"])))
    return out


def read_supertune_metrics(path: Path) -> tuple[list[StepRecord], float]:
    """Per-step records from a supertune run's metrics.jsonl, and the first_step event's unix_time.

    The first_step event gives the callback's clock origin (unix_time - elapsed_s); each loss line
    (logging_steps=1) gives its step's elapsed_s and tokens_seen. Times are rounded to the
    millisecond there, far below the intervals measured. All steps take their time from the log
    lines so that every interval is measured between the same two points of the training loop.
    """
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    first = next((r for r in rows if r.get("event") == "first_step"), None)
    if first is None:
        raise ValueError(f"{path}: no first_step event")
    origin = float(first["unix_time"]) - float(first["elapsed_s"])
    by_step: dict[int, StepRecord] = {}
    for r in rows:
        if "loss" in r and "tokens_seen" in r:
            step = int(r["step"])
            by_step.setdefault(step, StepRecord(step, origin + float(r["elapsed_s"]), int(r["tokens_seen"])))
    return list(by_step.values()), float(first["unix_time"])
