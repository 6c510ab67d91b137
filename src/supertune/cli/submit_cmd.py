"""`supertune submit [CONFIG] --cluster NAME --nodes N [--launcher L] [--time T] [--dry-run] [key=value ...]`"""

from __future__ import annotations

import argparse
import sys

from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = (
    "Create a run directory (resolved config and rendered job script) and submit it to SLURM, printing the job id. "
    "With --dry-run, print the job script and submit nothing. Without CONFIG: the embedded default run. "
    "Runs on a login node: no torch import."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune submit run.yaml --cluster leonardo --nodes 4 --launcher srun --time 12:00:00\n"
        "  supertune submit run.yaml --cluster lumi --nodes 2 --launcher accelerate --dry-run\n"
        "  supertune submit run.yaml --cluster leonardo --nodes 8 --preflight --expect-gbps 20   # stop before training on a slow network\n"
        "  supertune submit --cluster local --nodes 2 launch.procs_per_node=1 training.max_steps=50\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..launch.launchers import launcher_names

    add_run_config_arguments(p)
    p.add_argument("--cluster", help="cluster profile (launch.cluster); see `supertune clusters list`")
    p.add_argument("--nodes", type=int, help="nodes (launch.nodes)")
    p.add_argument("--launcher", choices=launcher_names(), help="launcher (launch.launcher)")
    p.add_argument("--time", help="wall-clock limit, HH:MM:SS or D-HH:MM:SS (slurm.time)")
    p.add_argument(
        "--run-dir",
        help="run directory (default: <output.runs_root>/<output.name>-<timestamp>); an unfinished run there is "
        "submitted again and resumes from its latest good checkpoint",
    )
    p.add_argument(
        "--preflight", action="store_true",
        help="run `supertune doctor --comm` as the job's first step (slurm.preflight); a failed check stops the job before training",
    )  # fmt: skip
    p.add_argument(
        "--expect-gbps", type=float, metavar="X",
        help="with the pre-flight: stop the job when the measured bus bandwidth is below X GB/s (slurm.preflight_gbps; implies --preflight)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the job script; submit nothing")


def run(args: argparse.Namespace) -> int:
    from ..resolve import resolve
    from ..runs.slurm import start_slurm

    config, overrides = split_config_and_overrides(args)
    flags = {
        "launch.cluster": args.cluster, "launch.nodes": args.nodes, "launch.launcher": args.launcher, "slurm.time": args.time,
        "slurm.preflight": "true" if args.preflight or args.expect_gbps is not None else None, "slurm.preflight_gbps": args.expect_gbps,
    }  # fmt: skip
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]
    # The same resolution and checks as `train` (the profile is loaded there, once).
    field = "--run-dir" if args.run_dir else "output.runs_root"
    started = start_slurm(resolve(config, overrides), args.run_dir, field, dry_run=args.dry_run)
    run_dir = started.run
    if started.choice.finished or started.choice.resumed:
        print(f"supertune: {started.choice.message}", file=sys.stderr)
    if started.choice.finished:
        return 0
    if args.dry_run:
        sys.stdout.write(started.script or "")
        print(f"supertune: dry run: script in {run_dir.job_script}, nothing submitted", file=sys.stderr)
        return 0
    print(started.job_id)
    print(f"supertune: submitted job {started.job_id}; run dir {run_dir.path}", file=sys.stderr)
    return 0
