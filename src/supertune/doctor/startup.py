"""The one doctor check run before training builds anything (by `supertune train` before the run
directory exists, and by every worker process of a job): a job given GPUs whose PyTorch build cannot
see them (a CPU build on a GPU node, a CUDA build on a ROCm node, every device hidden) would otherwise
train on the CPU for hours. It costs importing torch (which training does next anyway), a look at
/dev and the environment."""

from __future__ import annotations

import os

from ..errors import UserError
from ..launch.environment import slurm_allocation
from .gpus import check_gpu_visibility
from .probe import read_gpu_hardware, read_torch

__all__ = ["refuse_invisible_gpus"]


def refuse_invisible_gpus() -> None:
    """UserError with the fix when the GPUs allocated to this job (or present on this node) are invisible to torch."""
    result = check_gpu_visibility(read_torch(), read_gpu_hardware(), slurm_allocation(), os.environ)
    if result.verdict == "fail":
        raise UserError(f"{result.name}: {result.evidence}; fix: {result.fix} (supertune doctor checks the rest of the node)")
