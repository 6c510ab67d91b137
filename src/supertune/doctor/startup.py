"""The doctor checks run before training builds anything (by `supertune train` before the run
directory exists, and by every worker process of a job): a job given GPUs whose PyTorch build cannot
see them (a CPU build on a GPU node, a CUDA build on a ROCm node, every device hidden) would
otherwise train on the CPU for hours, and one whose build has no kernels for its GPUs (a CUDA 13
build on V100s) would stop at its first operation with CUDA's error. It costs importing torch (which
training does next anyway), a look at /dev and the environment."""

from __future__ import annotations

import os

from ..errors import UserError
from ..launch.environment import slurm_allocation
from .gpus import check_gpu_visibility, check_gpus
from .probe import read_gpu_hardware, read_torch

__all__ = ["refuse_unusable_gpus"]


def refuse_unusable_gpus() -> None:
    """UserError with the fix when the GPUs allocated to this job (or present on this node) are
    invisible to torch, or when torch has no kernels for them."""
    torch = read_torch()
    for result in (check_gpu_visibility(torch, read_gpu_hardware(), slurm_allocation(), os.environ), check_gpus(torch)):
        if result.verdict == "fail":
            raise UserError(
                f"{result.name}: {result.evidence}; fix: {result.fix} (supertune doctor checks the rest of the node)"
            )
