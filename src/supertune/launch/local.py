"""Several processes on this machine through torchrun: the command line, built purely."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["torchrun_argv"]


def torchrun_argv(nproc: int, run_dir: Path) -> list[str]:
    """torchrun on this host: a free port picked by --standalone, one worker per process, reading the run dir's config."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "supertune.train.worker",
        str(run_dir),
    ]
