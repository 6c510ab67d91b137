"""Several processes on this machine through torchrun: the command line, built purely."""

from __future__ import annotations

import sys

from ..entry import TRAIN_WORKER, entry_words

__all__ = ["torchrun_argv", "thread_oversubscription"]


def torchrun_argv(nproc: int, args: list[str], entry: str = TRAIN_WORKER, max_restarts: int = 0) -> list[str]:
    """torchrun on this host: a free port picked by --standalone, `nproc` processes each running the
    entry point `entry` with `args` (training's worker on a run directory, by default); after a
    failure it restarts them max_restarts times (training's workers resume)."""
    return [
        sys.executable,
        "-m",
        "supertune.launch.torchrun_agent",  # torch.distributed.run, its failure report in one line
        "--standalone",
        f"--nproc-per-node={nproc}",
        *([f"--max-restarts={max_restarts}"] if max_restarts else []),
        *map(str, entry_words(entry, args)),
    ]


def thread_oversubscription(nproc: int, omp_num_threads: str | None, usable_cores: int) -> str | None:
    """A warning when OMP_NUM_THREADS (which torchrun passes on as it is; unset, it gives each process
    1) times the processes exceeds the cores this process may use, else None. Threads that outnumber
    cores spin in each other's way: 2 processes x 2 threads on 2 cores trained the embedded default
    3.7x slower than 2 x 1 (52.5 s vs 14.4 s for 40 steps)."""
    if omp_num_threads is None or not omp_num_threads.strip().isdigit():
        return None
    threads = int(omp_num_threads)
    if threads * nproc <= usable_cores:
        return None
    fit = max(1, usable_cores // nproc)
    return (
        f"OMP_NUM_THREADS={threads} x {nproc} processes = {threads * nproc} CPU threads on {usable_cores} usable cores: "
        f"threads that outnumber cores slow training several times; set OMP_NUM_THREADS={fit} (or unset it: torchrun gives each process 1)"
    )
