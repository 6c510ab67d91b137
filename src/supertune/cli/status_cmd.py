"""`supertune status [RUN]`"""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "Show the SLURM state of a run's jobs (state, nodes, elapsed time, restarts after a time limit or "
    "preemption, newest checkpoint), or of every run under ./runs."
)


def epilog() -> str:
    return "examples:\n  supertune status\n  supertune status runs/llama-it-20261121-101500\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run directory or run name (default: every submitted run under ./runs)")
    p.add_argument("--runs-root", default="runs", help="where run names are looked up (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from ..checkpoints.layout import CheckpointDir
    from ..rundir import RunDir
    from ..slurm.commands import job_state
    from ..slurm.jobs import find_run, job_records

    if args.run:
        runs = [find_run(args.run, args.runs_root)]
    else:
        root = Path(args.runs_root)
        runs = [RunDir(p) for p in sorted(root.iterdir())] if root.is_dir() else []
    rows = []
    for run in runs:
        latest = CheckpointDir(run.checkpoints).latest()
        checkpoint = latest.name if latest else "-"
        for record in job_records(run):
            s = job_state(record.job_id)
            # A pending job's reason (Resources, Priority, QOSMaxJobsPerUserLimit, ...) says what it waits for.
            state = f"{s.state} ({s.reason})" if s.state == "PENDING" and s.reason not in ("", "None") else s.state
            rows.append(
                (
                    run.path.name,
                    record.job_id,
                    record.cluster,
                    state,
                    s.nodes or "-",
                    s.elapsed or "-",
                    str(s.restarts),
                    checkpoint,
                )
            )
    if not rows:
        print("no submitted runs" + (f" in {args.run}" if args.run else f" under {args.runs_root}/"))
        return 0
    header = ("RUN", "JOB", "CLUSTER", "STATE", "NODES", "ELAPSED", "RESTARTS", "CHECKPOINT")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
