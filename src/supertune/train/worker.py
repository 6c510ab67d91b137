"""Entry point of each process under torchrun: `python -m supertune.train.worker RUN_DIR`."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config.load import load_run_config
from ..errors import UserError
from ..launch.environment import export_for_torch, launch_environment
from ..rundir import RunDir
from .logging_setup import setup_logging
from .run import run_training


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m supertune.train.worker RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(Path(args[0]))
    view = launch_environment()
    if view.launcher in ("slurm", "mpi"):
        # srun / mpirun started this process directly: give torch.distributed its env:// variables.
        export_for_torch(view)
    setup_logging()
    try:
        run_training(load_run_config(str(run.config)), run)
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
