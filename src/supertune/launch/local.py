"""Several processes on this machine through torchrun: the command line, built purely."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["torchrun_argv"]


def torchrun_argv(nproc: int, run_dir: Path, max_restarts: int = 0) -> list[str]:
    """torchrun on this host: a free port picked by --standalone, one worker per process, reading
    the run dir's config; after a failure it restarts them max_restarts times (they resume)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *([f"--max-restarts={max_restarts}"] if max_restarts else []),
        "-m",
        "supertune.train.worker",
        str(run_dir),
    ]
