"""Entry point of each training process: `python -m supertune.train.worker RUN_DIR`.

Started by torchrun (`supertune train --nproc N`, and inside SLURM jobs), by `accelerate launch`, by
the deepspeed launcher, or directly by srun; supertune.launch.environment tells them apart.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from .signals import install_signal_handlers

# First of all: SIGUSR1's default action ends the process, and the imports below take seconds.
install_signal_handlers()

from ..config.load import load_run_config  # noqa: E402
from ..errors import UserError  # noqa: E402
from ..launch.environment import LaunchEnvironment, export_for_torch, launch_environment  # noqa: E402
from ..rundir import RunDir  # noqa: E402
from .logging_setup import setup_logging  # noqa: E402
from .run import run_training  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """0 when the run finished or stopped on request after its checkpoint (the launcher must not
    treat that as a failure and restart it); 2 on a user error."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m supertune.train.worker RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(Path(args[0]))
    view = launch_environment()
    if view.launcher in ("slurm", "mpi"):
        # srun / mpirun started this process directly: give torch.distributed its env:// variables.
        export_for_torch(view)
    # One line per process, so that a job log shows which processes started where and how.
    print(f"supertune: {describe(view)}", flush=True)
    setup_logging()
    try:
        run_training(load_run_config(str(run.config)), run)
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2
    leave_in_order(view)
    return 0


# The torchrun agent of the first node hosts the store where the agents of all nodes meet when their
# processes have ended. If another node's agent gets there last, the first one may already have left
# with its store, and that agent logs a traceback in a job that succeeded (pytorch/pytorch#69520;
# seen here with accelerate on two nodes). So the first node's processes end last: a few seconds
# after the others, enough for their agents to see them end and check in (they poll every 0.1 s).
EXIT_GRACE_S = 5.0


def leave_in_order(view: LaunchEnvironment) -> None:
    """On several nodes under torchrun agents: all processes finish together, the first node's last."""
    if not (view.elastic_agent and view.num_nodes > 1):
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if view.node_rank == 0:
        time.sleep(EXIT_GRACE_S)


def describe(view: LaunchEnvironment) -> str:
    """This process's place in the job, in one line."""
    master = f"{view.master_addr}:{view.master_port}" if view.master_addr else "none"
    return (
        f"rank {view.rank} of {view.world_size} on {socket.gethostname()} "
        f"(node {view.node_rank} of {view.num_nodes}, local rank {view.local_rank} of {view.local_world_size}), "
        f"started by {view.launcher}, master {master}"
    )


if __name__ == "__main__":
    sys.exit(main())
