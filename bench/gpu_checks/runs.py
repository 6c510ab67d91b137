"""Starting the checklist's processes: `supertune train`/`eval`/`doctor` and the plain-Trainer
baseline, each with its own log file and a time limit taken from what is left of the budget.

A run that outlives its limit is killed with its whole process group (torchrun's workers too), so
one hang costs its own slot, never the checks after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Budget:
    """Seconds left for the whole checklist; each run gets at most what is left minus a margin for the report."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    margin: float = 15.0

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started) - self.margin

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate


@dataclass
class Done:
    """One finished (or killed) process."""

    name: str
    argv: list[str]
    returncode: int | None  # None: killed at its time limit
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 6) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def why(self) -> str:
        if self.returncode is None:
            return f"killed at its time limit after {self.seconds:.0f} s; log: {self.tail(3)}"
        return f"exit {self.returncode}; log: {self.tail()}"


class Runner:
    def __init__(self, work: Path, env: dict[str, str], budget: Budget) -> None:
        self.work, self.env, self.budget = work, env, budget
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def run(self, name: str, argv: list[str], *, cap: float, extra_env: dict[str, str] | None = None) -> Done:
        """Run argv with stdout+stderr to logs/<name>.log, for at most min(cap, budget left) seconds."""
        log = self.logs / f"{name}.log"
        limit = max(1.0, min(cap, self.budget.left()))
        env = dict(self.env, **(extra_env or {}))
        started = time.monotonic()
        with log.open("w", encoding="utf-8") as out:
            out.write("$ " + " ".join(argv) + "\n")
            out.flush()
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.work, start_new_session=True
            )
            try:
                code: int | None = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        return Done(name, argv, code, time.monotonic() - started, log)

    def supertune(self, name: str, *args: str, cap: float, extra_env: dict[str, str] | None = None) -> Done:
        return self.run(name, [sys.executable, "-m", "supertune", *args], cap=cap, extra_env=extra_env)

    def train(
        self,
        name: str,
        overrides: list[str],
        *,
        run: str | None = None,
        cap: float,
        extra_env: dict[str, str] | None = None,
    ) -> tuple[Done, Path]:
        """`supertune train` into runs/<run or name> (a resume names the run it continues)."""
        run_dir = self.work / "runs" / (run or name)
        done = self.supertune(name, "train", "--run-dir", str(run_dir), *overrides, cap=cap, extra_env=extra_env)
        return done, run_dir


def summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


EVAL_LINE = re.compile(r"eval loss ([0-9.]+)")


def eval_loss(done: Done) -> float | None:
    """The loss `supertune eval` printed, or None."""
    if not done.ok:
        return None
    found = EVAL_LINE.findall(done.log.read_text(encoding="utf-8", errors="replace"))
    return float(found[-1]) if found else None
