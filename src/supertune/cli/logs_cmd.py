"""`supertune logs RUN [--follow]`"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DESCRIPTION = (
    "Print the job log of a run's latest SLURM job (stdout, then stderr); --follow keeps printing until the job ends."
)


def epilog() -> str:
    return "examples:\n  supertune logs runs/llama-it-20261121-101500\n  supertune logs llama-it --follow\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory or run name")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the job finishes")
    p.add_argument("--job", help="a job id of the run (default: the latest)")
    p.add_argument("--runs-root", default="runs", help="where run names are looked up (default: %(default)s)")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    import codecs

    from ..errors import UserError
    from ..slurm.commands import job_state
    from ..slurm.jobs import find_run, job_records, log_files

    run_dir = find_run(args.run, args.runs_root)
    records = job_records(run_dir)
    if not records:
        raise UserError(f"RUN: {run_dir.path} has no submitted job (supertune submit creates them)")
    job_id = args.job or records[-1].job_id
    if args.job and args.job not in {r.job_id for r in records}:
        raise UserError(f"--job: {args.job} is not a job of {run_dir.path}")
    offsets: dict[Path, int] = {}
    # Incremental decoders: a read may end inside a multi-byte character (progress bars draw with them).
    decoders: dict[Path, codecs.IncrementalDecoder] = {}
    while True:
        state = job_state(job_id) if args.follow else None
        for path in log_files(run_dir, job_id):
            with path.open("rb") as f:
                f.seek(offsets.get(path, 0))
                data = f.read()
            offsets[path] = offsets.get(path, 0) + len(data)
            decoder = decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            text = decoder.decode(data, final=state is None or state.finished)
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
        if not offsets and (state is None or state.finished):
            state = state or job_state(job_id)
            print(f"supertune: job {job_id} has no log in {run_dir.logs} ({state.state})", file=sys.stderr)
        if state is None or state.finished:
            return 0
        time.sleep(args.poll)
