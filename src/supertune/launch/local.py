"""Several processes on this machine through torchrun: the command line, built purely."""

from __future__ import annotations

import sys

from .launchers import WORKER_MODULE

__all__ = ["torchrun_argv"]


def torchrun_argv(nproc: int, args: list[str], module: str = WORKER_MODULE, max_restarts: int = 0) -> list[str]:
    """torchrun on this host: a free port picked by --standalone, `nproc` processes each running
    `python -m module args` (training's worker on a run directory, by default); after a failure it
    restarts them max_restarts times (training's workers resume)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *([f"--max-restarts={max_restarts}"] if max_restarts else []),
        "-m",
        module,
        *args,
    ]
