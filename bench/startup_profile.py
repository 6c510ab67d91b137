"""Where the time to the first optimizer step goes: supertune (a) against the run_clm-style recipe (c).

    .venv/bin/python bench/startup_profile.py [--rounds 2] [--imports]

Each arm runs cold, as in bench/train_throughput.py, but stops after step 1; phase boundaries are
noted by wrapping library functions (bench/throughput/phases.py). With --imports, it also prints the
costliest top-level imports of `supertune train` (python -X importtime). Nothing is written to
bench/results; this is a diagnosis tool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throughput.arms import ARMS, arm_environment
from throughput.cpu import CpuWindow, usable_cores, wait_until_quiet
from throughput.prepare import prepare
from throughput.settings import BenchSettings

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "wikitext-2")
    p.add_argument("--work-dir", type=Path, default=BENCH / "work")
    p.add_argument("--rounds", type=int, default=2, help="runs per arm; the table shows medians")
    p.add_argument(
        "--quiet-wait", type=float, default=15.0, help="seconds to wait at most for idle CPUs before each run"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per run (default: torch's own, one per core)"
    )
    p.add_argument("--imports", action="store_true", help="also list the costliest imports (python -X importtime)")
    return p.parse_args()


def run_phases(
    mode: str, arm_key: str, prepared, settings: BenchSettings, arm_dir: Path, quiet_wait: float
) -> tuple[list, float | None]:
    """One cold run of an arm up to step 1; its marks and the cores other processes used meanwhile."""
    arm_dir.mkdir(parents=True)
    arm_argv = ARMS[arm_key].argv(prepared, settings, arm_dir)
    # The arm's own arguments, minus its launcher (`supertune train` or `python script.py`).
    args = arm_argv[2:]
    out = arm_dir / "phases.json"
    env = arm_environment(arm_dir, settings.threads)
    env["PYTHONPATH"] = str(BENCH)
    cores = usable_cores()
    wait_until_quiet(quiet_wait, max(0, cores - (settings.threads or cores)) + 0.3)
    window = CpuWindow()
    window.start()
    env["BENCH_SPAWN_TIME"] = repr(time.time())
    with (arm_dir / "output.log").open("wb") as log:
        code = subprocess.call(
            [sys.executable, "-m", "throughput.phases", mode, str(out), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    window.stop()
    if code != 0 or not out.is_file():
        raise SystemExit(f"startup_profile: {mode} failed ({code}); see {arm_dir / 'output.log'}")
    return json.loads(out.read_text()), window.other_cores


def durations(marks: list) -> list[tuple[str, float]]:
    """Phase lengths from consecutive marks (the first phase starts at the spawn)."""
    out, prev = [], 0.0
    for name, t in marks:
        out.append((name, t - prev))
        prev = t
    return out


def merged(runs: list[list]) -> list[tuple[str, float]]:
    """Median length of each phase over runs (phases keyed by name and position)."""
    per_run = [durations(m) for m in runs]
    rows = []
    for i, (name, _) in enumerate(per_run[0]):
        rows.append((name, statistics.median(r[i][1] for r in per_run if i < len(r))))
    return rows


def import_costs(top: int = 10) -> list[tuple[str, float]]:
    """Cumulative import time of the top-level packages behind `supertune train`, costliest first.

    A package's time includes whatever it is the first to import (peft, for one, is where
    transformers' modeling code first loads), so the rows overlap and do not add up.
    """
    code = "import supertune.cli.main, supertune.train.run; from transformers import Trainer"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cumulative, name = line.split("|")
        name = name.strip()
        if "." not in name and not name.startswith("_") and cumulative.strip().isdigit():
            rows.append((name, int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> int:
    args = parse_args()
    settings = BenchSettings(threads=args.threads)
    prepared = prepare(args.data_dir.resolve(), args.work_dir.resolve(), settings)
    root = args.work_dir.resolve() / "startup" / time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, list] = {"supertune": [], "clm": []}
    loads: dict[str, list[float]] = {"supertune": [], "clm": []}
    for r in range(args.rounds):
        for mode, key in (("supertune", "a"), ("clm", "c")):
            marks, other = run_phases(mode, key, prepared, settings, root / f"{mode}-{r + 1}", args.quiet_wait)
            results[mode].append(marks)
            if other is not None:
                loads[mode].append(other)
            print(f"startup_profile: {mode} round {r + 1}: step 1 ended {marks[-1][1]:.2f} s after spawn", flush=True)
    for mode in ("supertune", "clm"):
        rows = merged(results[mode])
        load = f"; other processes used {statistics.median(loads[mode]):.2f} cores meanwhile" if loads[mode] else ""
        print(f"\n{mode}: median of {args.rounds} cold runs{load}")
        for name, seconds in rows:
            print(f"  {seconds:6.2f} s  {name}")
        print(f"  {sum(s for _, s in rows):6.2f} s  total to the end of step 1")
    if args.imports:
        print("\ncostliest packages imported by `supertune train` (cumulative, overlapping, one warm run):")
        for name, seconds in import_costs():
            print(f"  {seconds:6.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
