"""How busy the machine was: the benchmark shares its cores, so every arm reports what else ran beside it."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuWindow", "busy_cores", "usable_cores", "wait_until_quiet"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def usable_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent working since boot (Linux /proc/stat), None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    values = [int(x) for x in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / _TICKS


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def busy_cores(seconds: float = 1.0) -> float | None:
    """Cores kept busy by all processes over the next `seconds` (this one sleeps meanwhile)."""
    start = _busy_seconds()
    time.sleep(seconds)
    end = _busy_seconds()
    return None if start is None or end is None else (end - start) / seconds


def wait_until_quiet(max_wait_s: float, threshold_cores: float = 0.3) -> float | None:
    """Sleep in 1 s windows until other work uses under threshold_cores, or max_wait_s has passed; the last reading."""
    deadline = time.monotonic() + max_wait_s
    reading = busy_cores()
    while reading is not None and reading > threshold_cores and time.monotonic() < deadline:
        reading = busy_cores()
    return reading


@dataclass
class CpuWindow:
    """Measures, around one child process, its own CPU time and the cores other processes kept busy."""

    wall_start: float = 0.0
    busy_start: float | None = None
    children_start: float = 0.0
    wall_s: float = 0.0
    arm_cpu_s: float = 0.0
    other_cores: float | None = None
    """Average cores used by everything except the arm while it ran."""

    def start(self) -> None:
        self.wall_start = time.monotonic()
        self.busy_start = _busy_seconds()
        self.children_start = _children_cpu()

    def stop(self) -> None:
        self.wall_s = time.monotonic() - self.wall_start
        self.arm_cpu_s = _children_cpu() - self.children_start
        busy_end = _busy_seconds()
        if self.busy_start is not None and busy_end is not None and self.wall_s > 0:
            self.other_cores = max(0.0, (busy_end - self.busy_start - self.arm_cpu_s) / self.wall_s)
