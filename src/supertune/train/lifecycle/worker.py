"""Each training process: entry point `train-worker RUN_DIR` of supertune.entry.

Started by torchrun (`supertune train --nproc N`, and inside SLURM jobs), by `accelerate launch`, by
the deepspeed launcher, or directly by srun; supertune.launch.environment tells them apart.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from ..trainer.signals import install_signal_handlers

# First of all: SIGUSR1's default action ends the process, and the imports below take seconds.
install_signal_handlers()

from ...distributed.process_group import leave_process_group  # noqa: E402
from ...doctor.startup import refuse_unfit_node  # noqa: E402
from ...errors import UserError  # noqa: E402
from ...launch.environment import LaunchEnvironment, export_for_torch, launch_environment  # noqa: E402
from ...launch.exit_order import leave_in_order  # noqa: E402
from ...resolve import load_run_dir_config  # noqa: E402
from ...rundir import RunDir  # noqa: E402
from .logging_setup import setup_logging  # noqa: E402
from .run import run_training  # noqa: E402


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="the run directory (its config.yaml says what to train)"
    )


def run(args: argparse.Namespace) -> int:
    """Train, then end the process at once (exit_now): 0 when the run finished or stopped on request
    after its checkpoint (the launcher must not treat that as a failure and restart it); 2 on a user error."""
    exit_now(_train(RunDir(args.run_dir)))
    return 0  # not reached


def _train(run: RunDir) -> int:
    view = launch_environment()
    if view.lacks_torch_variables:
        # srun (the srun launcher) or mpirun started this process directly: give torch.distributed its
        # env:// variables. Asked of the environment, not of launch.launcher: `train --nproc` runs
        # the same config under torchrun on one machine.
        export_for_torch(view)
    # One line per process, so that a job log shows which processes started where and how.
    print(f"supertune: {describe(view)}", flush=True)
    setup_logging()
    try:
        refuse_unfit_node()  # in each process of a job: its node's TMPDIR, GPUs, PyTorch build and NCCL interfaces
        run_training(load_run_dir_config(run.config), run)
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2
    leave_in_order(view)
    leave_process_group()
    return 0


def exit_now(code: int) -> None:
    """End the process once the run's files are written, skipping the interpreter's teardown.

    Every file of the run is written, fsynced and renamed into place before this. What the teardown
    would still do is destroy native objects in no particular order, and a worker of a finished
    multi-process run now and then died there of SIGABRT ("terminate called without an active
    exception", seen 5 times in some hundreds of runs under load, never reproduced alone), which its
    launcher reports as a failed run. The cost: atexit handlers do not run; the logs are flushed here.
    """
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe(view: LaunchEnvironment) -> str:
    """This process's place in the job, in one line."""
    master = f"{view.master_addr}:{view.master_port}" if view.master_addr else "none"
    return (
        f"rank {view.rank} of {view.world_size} on {socket.gethostname()} "
        f"(node {view.node_rank} of {view.num_nodes}, local rank {view.local_rank} of {view.local_world_size}), "
        f"started by {view.launcher}, master {master}"
    )


if __name__ == "__main__":
    # Job scripts rendered before the entry table started workers as `python -m supertune.train.lifecycle.worker
    # RUN_DIR`; a job of those requeued after an upgrade runs that line again and must still resume.
    from ...entry import TRAIN_WORKER, main

    sys.exit(main([TRAIN_WORKER, *sys.argv[1:]]))
