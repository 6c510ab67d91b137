"""The doctor checks run before training builds anything (by `supertune train` before the run
directory exists, and by every worker process of a job), those whose failure the run would otherwise
meet later and worse:

- TMPDIR that is missing, a file or not writable: the kernel builds of Triton and DeepSpeed stop
  with a compiler error, minutes in;
- GPUs whose PyTorch build cannot see them (a CPU build on a GPU node, a CUDA build on a ROCm node,
  every device hidden): the job would train on the CPU for hours; a build with no kernels for its
  GPUs (a CUDA 13 build on V100s) would stop at its first operation with CUDA's error;
- in a process of a distributed run on GPUs, NCCL_SOCKET_IFNAME matching no usable interface (or
  only loopback across nodes): NCCL would stop, or wait until its timeout, at the first collective.

It costs importing torch (which training does next anyway), a look at /dev, /sys/class/net and the
environment."""

from __future__ import annotations

import os

from ..errors import UserError
from ..launch.environment import launch_environment, slurm_allocation
from .gpus import check_gpu_visibility, check_gpus
from .network import check_nccl_socket_ifname
from .probe import read_gpu_hardware, read_interfaces, read_torch
from .result import CheckResult
from .storage import check_tmpdir

__all__ = ["refuse_unfit_node"]


def refuse_unfit_node(gpus: bool = True) -> None:
    """UserError with the fix when a check above fails on this node; `gpus`: the GPU and NCCL checks
    too (the parent of a job's processes leaves them to the processes, which run where the GPUs are)."""
    checks: list[CheckResult] = [check_tmpdir(os.environ)]
    if gpus:
        torch = read_torch()
        checks += [check_gpu_visibility(torch, read_gpu_hardware(), slurm_allocation(), os.environ), check_gpus(torch)]
        view = launch_environment()
        if view.distributed and torch.device_count and torch.nccl:
            checks.append(check_nccl_socket_ifname(os.environ, read_interfaces(), view.num_nodes, nccl_used=True))
    for result in checks:
        if result.verdict == "fail":
            raise UserError(
                f"{result.name}: {result.evidence}; fix: {result.fix} (supertune doctor checks the rest of the node)"
            )
