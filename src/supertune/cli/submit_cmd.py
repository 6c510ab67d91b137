"""`supertune submit [CONFIG] --cluster NAME --nodes N [--launcher L] [--time T] [--dry-run] [key=value ...]`"""

from __future__ import annotations

import argparse
import sys
from typing import Any

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
    from pathlib import Path

    from ..resolve import resolve
    from ..slurm.jobs import prepare_job, render_job, submit_job
    from .run_dir_choice import choose_run_dir

    config, overrides = split_config_and_overrides(args)
    flags = {
        "launch.cluster": args.cluster, "launch.nodes": args.nodes, "launch.launcher": args.launcher, "slurm.time": args.time,
        "slurm.preflight": "true" if args.preflight or args.expect_gbps is not None else None, "slurm.preflight_gbps": args.expect_gbps,
    }  # fmt: skip
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]
    # The same resolution and checks as `train` (the profile is loaded there, once).
    resolution = resolve(config, overrides)
    cfg, profile = resolution.config, resolution.profile
    # Render once before creating anything, so that a run directory the job script cannot hold
    # leaves no half-made run behind. A default run dir gets its timestamp later: digits and '-'
    # only, which change nothing about quoting.
    planned = args.run_dir or str(Path(cfg.output.runs_root) / f"{cfg.output.name}-00000000-000000")
    render_job(
        cfg, profile, str(Path(planned).expanduser().absolute()), "--run-dir" if args.run_dir else "output.runs_root"
    )
    choice = choose_run_dir(args.run_dir, resolution, no_resume=False)
    if choice.finished:
        print(f"supertune: {choice.message}", file=sys.stderr)
        return 0
    run_dir = choice.run
    if choice.resumed:
        if not args.dry_run:
            _refuse_while_queued(run_dir)
        print(f"supertune: {choice.message}", file=sys.stderr)
    _, script = prepare_job(cfg, profile, run_dir)
    if args.dry_run:
        sys.stdout.write(script)
        print(f"supertune: dry run: script in {run_dir.job_script}, nothing submitted", file=sys.stderr)
        return 0
    job_id = submit_job(run_dir, profile.name)
    print(job_id)
    print(f"supertune: submitted job {job_id}; run dir {run_dir.path}", file=sys.stderr)
    return 0


def _refuse_while_queued(run: Any) -> None:
    """Two jobs must never train the same run directory at once."""
    from ..errors import UserError
    from ..slurm.commands import job_state
    from ..slurm.jobs import job_records

    records = job_records(run)
    if records:
        state = job_state(records[-1].job_id)
        if not state.finished:  # pending, running, requeued, suspended...: it may still write to the run
            raise UserError(
                f"--run-dir: job {records[-1].job_id} of this run is still {state.state}; it resumes by itself "
                f"after a requeue (cancel it first with `supertune cancel {run.path}` to submit anew)"
            )
