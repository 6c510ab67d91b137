"""Where the time to the first optimizer step goes: supertune (a) against the run_clm-style recipe (c).

    .venv/bin/python bench/startup_profile.py [--rounds 2] [--imports]

Each arm runs cold, as in bench/train_throughput.py, but stops after step 1; phase boundaries are
noted by wrapping library functions (bench/throughput/phases.py). With --imports, it also prints the
costliest top-level imports of `supertune train` (python -X importtime). Nothing is written to
bench/results; this is a diagnosis tool.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throughput.instrumented import run_instrumented
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
    code = "import supertune.cli.main, supertune.train.lifecycle.run; from transformers import Trainer"
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
            marks, other = run_instrumented(
                "startup_profile", "phases", mode, key, prepared, settings, root / f"{mode}-{r + 1}", args.quiet_wait
            )
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
