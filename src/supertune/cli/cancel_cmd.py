"""`supertune cancel RUN`"""

from __future__ import annotations

import argparse

DESCRIPTION = "Cancel the unfinished SLURM jobs of a run."


def epilog() -> str:
    return "examples:\n  supertune cancel runs/llama-it-20261121-101500\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory or run name")
    p.add_argument("--runs-root", default="runs", help="where run names are looked up (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from ..slurm.commands import cancel_job, job_state
    from ..slurm.jobs import find_run, job_records

    run_dir = find_run(args.run, args.runs_root)
    cancelled = 0
    for record in job_records(run_dir):
        if not job_state(record.job_id).finished:
            cancel_job(record.job_id)
            print(f"cancelled job {record.job_id}")
            cancelled += 1
    if not cancelled:
        print(f"nothing to cancel: no unfinished job in {run_dir.path}")
    return 0
