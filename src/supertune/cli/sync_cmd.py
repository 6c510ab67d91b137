"""`supertune sync RUN...`"""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Upload the offline Weights & Biases runs of run directories (training.report_to: [wandb] writes them "
    "into <run dir>/wandb on nodes without a way out) with `wandb sync`, from a machine that reaches the "
    "W&B server (log in first: `wandb login`, or WANDB_API_KEY). A requeued or resumed run has several "
    "offline folders of one W&B run; all are uploaded, oldest first. A federation directory: its global series "
    "and every site's run of every round."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune sync runs/llama-it-20261121-101500\n"
        "  supertune sync runs/sweep-* --dry-run        # what would be uploaded\n"
        "  supertune sync federations/fed-20261121-101500   # a federation's tracked group\n"
        "  WANDB_PROJECT=my-project supertune sync llama-it --runs-root runs\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories, run names or federation directories")
    p.add_argument("--runs-root", default="runs", help="where run names are looked up (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the command and wandb's plan; upload nothing")


def run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from ..slurm.jobs import find_run
    from ..subprocesses import run_foreground
    from ..tracking.sync import federation_runs, sync_command

    runs = []
    for ref in args.runs:  # a federation directory: its global series and every site's run of every round
        found = federation_runs(Path(ref).expanduser().absolute())
        runs += found if found is not None else [find_run(ref, args.runs_root)]
    argv = sync_command(runs, dry_run=args.dry_run)
    print(shlex.join(argv), flush=True)
    return run_foreground(argv)
