"""One cold run of an arm under an instrumenting module of bench/throughput (phases, step_costs).

The arm's own command line less its launcher (`supertune train` or `python script.py`) goes to
`python -m throughput.<module> MODE OUT [module arguments] ARGS`, in the arm's cold environment with
bench/ on the path and BENCH_SPAWN_TIME set to the moment of the spawn.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .arms import ARMS, arm_environment
from .cpu import CpuWindow, usable_cores, wait_until_quiet
from .prepare import Prepared
from .settings import BenchSettings

__all__ = ["run_instrumented"]

BENCH = Path(__file__).resolve().parent.parent


def run_instrumented(
    tool: str,
    module: str,
    mode: str,
    arm_key: str,
    prepared: Prepared,
    settings: BenchSettings,
    arm_dir: Path,
    quiet_wait: float,
    module_args: tuple[str, ...] = (),
) -> tuple[Any, float | None]:
    """The JSON the module wrote, and the cores other processes used meanwhile; exits naming the log on failure."""
    arm_dir.mkdir(parents=True)
    args = ARMS[arm_key].argv(prepared, settings, arm_dir)[2:]
    out = arm_dir / f"{module}.json"
    env = arm_environment(arm_dir, settings.threads)
    env["PYTHONPATH"] = str(BENCH)
    cores = usable_cores()
    wait_until_quiet(quiet_wait, max(0, cores - (settings.threads or cores)) + 0.3)
    window = CpuWindow()
    window.start()
    env["BENCH_SPAWN_TIME"] = repr(time.time())
    with (arm_dir / "output.log").open("wb") as log:
        code = subprocess.call(
            [sys.executable, "-m", f"throughput.{module}", mode, str(out), *module_args, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    window.stop()
    if code != 0 or not out.is_file():
        raise SystemExit(f"{tool}: {mode} failed ({code}); see {arm_dir / 'output.log'}")
    return json.loads(out.read_text()), window.other_cores
