"""`supertune doctor [--json] [--comm [--nproc N] [--expect-gbps X]] [--exchange URL [--probe-mb N]]`"""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Check this node's environment for training and name the fix for each problem: Python and package versions, "
    "torch's build against the GPUs and driver, each GPU (memory, bf16), NCCL/RCCL, the SLURM allocation, network "
    "interfaces against NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, InfiniBand/Slingshot, Hugging Face caches and offline "
    "flags, writable directories and free space. --comm also measures all_reduce and all_gather bandwidth between "
    "the processes of the job; --exchange measures the link to a federation's exchange. Exit code 1 when a check "
    "fails (warnings do not), 2 for wrong options."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune doctor                                    # this node, in seconds\n"
        "  supertune doctor --json | jq '.checks[] | select(.verdict == \"fail\")'\n"
        "  supertune doctor --comm --nproc 2 --max-size 64M    # two local processes (gloo on CPU, nccl on GPUs)\n"
        "  srun -N2 --ntasks-per-node=4 supertune doctor --comm --expect-gbps 20   # inside an allocation\n"
        "  supertune doctor --exchange ssh://me@vm.example.org/srv/fed   # round trip, upload and download rate\n"
        "\n"
        "bandwidth: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n for all_gather,\n"
        "as nccl-tests define them; GB/s = 1e9 bytes/s. docs/doctor.md explains every check.\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..doctor.options import add_doctor_arguments

    add_doctor_arguments(p)
    p.add_argument(
        "--exchange",
        metavar="URL",
        help="only measure the link to a federation's exchange (a directory or ssh://[user@]host[:port]/path): "
        "round trip, upload and download rate of a probe file, removed afterwards",
    )
    p.add_argument(
        "--probe-mb",
        type=int,
        default=32,
        metavar="N",
        help="with --exchange: size of the probe file in MB, 1 to 1000 (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from ..doctor.options import options_from_args
    from ..launch.environment import launch_environment

    if args.exchange is not None:
        return _measure_exchange(args)
    options = options_from_args(args)
    if options.nproc and not launch_environment().distributed:
        return _run_local_processes(options)
    from ..doctor.run import run_doctor

    return run_doctor(options)


def _run_local_processes(options) -> int:
    """N processes through torchrun, each running the doctor's worker; rank 0 prints the report.

    The workers exit 0 after a complete report (a failing torchrun worker ends in a launcher
    traceback that would bury the report); the verdict comes back through the JSON report file.
    """
    import json
    import sys
    import tempfile
    from pathlib import Path

    from ..entry import DOCTOR_WORKER
    from ..launch.local import torchrun_argv
    from ..subprocesses import run_foreground

    with tempfile.TemporaryDirectory(prefix="supertune-doctor-") as tmp:
        report = Path(options.out or Path(tmp) / "doctor.json")
        report.unlink(missing_ok=True)
        code = run_foreground(
            torchrun_argv(options.nproc, options.worker_argv(out=str(report), exit_zero=True), entry=DOCTOR_WORKER)
        )
        if code != 0 or not report.exists():
            print(
                f"supertune: error: the doctor's processes exited with code {code} before reporting; see the output above",
                file=sys.stderr,
                flush=True,
            )
            return code or 1
        return int(json.loads(report.read_text())["exit_code"])


def _measure_exchange(args: argparse.Namespace) -> int:
    import json

    from ..errors import UserError
    from ..exchange.link_check import link_text, measure_link

    if args.comm or args.nproc:
        raise UserError("--exchange: measures the link to an exchange only; run --comm separately")
    if not 1 <= args.probe_mb <= 1000:
        raise UserError(f"--probe-mb: must be from 1 to 1000 MB, got {args.probe_mb}")
    result = measure_link(args.exchange, args.probe_mb * 1_000_000)
    print(json.dumps(result, indent=2) if args.json else link_text(result), flush=True)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
