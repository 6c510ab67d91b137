"""Deadlines for tests that must hold on a loaded machine as on an idle one.

A test whose federation leaves a site out at a round's deadline needs a deadline that the other
sites' work fits in, whatever else the machine runs: on the suite's 2 cores with other work beside
it, a training process's start took 4-5x its idle time. So such a deadline is a multiple of what
starting one costs here and now (importing the training stack in a fresh process), never below
the idle figure the test was written with. It costs one such start (~8 s idle) per test process."""

from __future__ import annotations

import functools
import subprocess
import sys
import time


@functools.cache
def start_seconds() -> float:
    """Wall seconds a fresh Python process takes to import supertune's training worker, now."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import supertune.train.lifecycle.worker"], check=True, timeout=900)
    return time.monotonic() - began


def deadline_seconds(least: int, starts: float) -> int:
    """`least` seconds, or the time of `starts` process starts on this machine now when longer."""
    return max(least, round(starts * start_seconds()))
