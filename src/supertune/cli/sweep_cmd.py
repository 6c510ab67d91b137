"""`supertune sweep [CONFIG] (--cluster NAME --gpus 1,2,4 | --nproc 1,2) [--keep global-batch|per-device-batch] [key=value ...]`"""

from __future__ import annotations

import argparse
import sys

from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = (
    "Run the same config at several scales, one run per scale, grouped in one sweep directory with its manifest "
    "(sweep.json): SLURM jobs with --cluster and --gpus (nodes from the profile's GPUs per node; processes on CPU "
    "nodes), or processes on this machine with --nproc. --keep global-batch (the default) keeps the smallest "
    "scale's sequences per optimizer step, per-device batch x gradient accumulation derived per scale (strong "
    "scaling); --keep per-device-batch keeps each device's batch (weak scaling). `supertune report` makes the "
    "table and plots. Submitting needs no torch."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune sweep run.yaml --cluster leonardo --gpus 1,2,4,8,16 --time 02:00:00\n"
        "  supertune sweep run.yaml --cluster lumi --gpus 8,16,32 --keep per-device-batch --wait\n"
        "  supertune sweep --nproc 1,2 training.max_steps=60          # the embedded default, 1 and 2 local processes\n"
        "  supertune report runs/supertune-sweep-20261123-101500      # the table and plots\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..launch.launchers import launcher_names
    from ..sweeps.scales import KEEP_CHOICES

    add_run_config_arguments(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--gpus",
        type=_counts,
        metavar="N,N,...",
        help="devices per run, as SLURM jobs on --cluster (processes on CPU-only profiles)",
    )
    where.add_argument(
        "--nproc", type=_counts, metavar="N,N,...", help="processes per run on this machine, one run after the other"
    )
    p.add_argument("--cluster", help="cluster profile of the SLURM jobs (launch.cluster); needed with --gpus")
    p.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        default="global-batch",
        help="what stays the same across scales (default: %(default)s)",
    )
    p.add_argument("--sweep-dir", help="sweep directory (default: <output.runs_root>/<output.name>-sweep-<timestamp>)")
    p.add_argument("--launcher", choices=launcher_names(), help="SLURM launcher (launch.launcher)")
    p.add_argument("--time", help="wall-clock limit of each job, HH:MM:SS (slurm.time)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="with --gpus: wait until every job has ended (exit code 1 when a run failed)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="with --gpus: write the run directories and job scripts, submit nothing"
    )


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..sweeps import sweep as sweeps

    if args.gpus and not args.cluster:
        raise UserError(
            "--gpus submits SLURM jobs: give the cluster with --cluster NAME (or --nproc for local processes)"
        )
    config, overrides = split_config_and_overrides(args)
    slurm = args.gpus is not None
    flags = {"launch.cluster": args.cluster, "launch.launcher": args.launcher, "slurm.time": args.time}
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]
    planned = sweeps.plan_sweep(
        config, overrides, args.gpus if slurm else args.nproc, args.keep, args.cluster if slurm else None
    )
    root = sweeps.sweep_root(args.sweep_dir, planned)
    if slurm:
        sweeps.render_all(planned, root)
    sweep = sweeps.new_sweep(
        root, planned, "slurm" if slurm else "local", args.keep, config, overrides, args.cluster if slurm else None
    )
    _say(f"sweep dir {sweep.path} ({sweep.scaling} scaling: --keep {args.keep})")
    if not slurm:
        ok = sweeps.run_local(sweep, planned, _say)
    else:
        sweeps.submit_slurm(sweep, planned, args.dry_run, _say)
        ok = sweeps.wait_for_jobs(sweep, say=_say) if args.wait and not args.dry_run else True
    if ok and (not slurm or args.wait):
        _say(f"report: supertune report {sweep.path}")
    return 0 if ok else 1


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers, e.g. 1,2,4") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one or more counts of at least 1, e.g. 1,2,4")
    return counts


def _say(line: str) -> None:
    print(f"supertune: sweep: {line}", file=sys.stderr, flush=True)
