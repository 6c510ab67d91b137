"""What a process needs before and after the Trainer's arguments exist for DeepSpeed to run, on GPU or CPU.

On a machine without GPUs three things differ from DeepSpeed's GPU path:
- DS_ACCELERATOR=cpu names DeepSpeed's CPU accelerator outright, instead of letting it probe for
  other vendors' libraries and fall back with a warning;
- the communication backend is gloo, initialised here through deepspeed.comm. DeepSpeed's CPU
  accelerator would pick oneCCL when its bindings are installed; gloo is what every torch build has.
  No pdsh or ssh is involved: torchrun (or srun) starts the processes, DeepSpeed only joins them.
- accelerate 1.x only recognises DeepSpeed when the process has an accelerator device. On CPU it
  initialises deepspeed.comm correctly but records "1 process, rank 0" in its shared state, so every
  rank would train on the whole dataset and believe it is the main process. `correct_accelerate_state`
  writes the true rank and world size back, and the strategy guard checks the result.
DeepSpeed also compiles small C++ ops on first use on CPU (its shared-memory collectives, and with
offload its CPU Adam): g++ and ninja are needed once, the result is cached in
~/.cache/torch_extensions (TORCH_EXTENSIONS_DIR moves it). Pre-building them at install time
(DS_BUILD_OPS=1 pip install deepspeed) is not needed.
"""

from __future__ import annotations

import os
from datetime import timedelta

from ..launch.environment import LaunchEnvironment

__all__ = ["start_deepspeed_process", "correct_accelerate_state", "leave_deepspeed_unimported"]


def start_deepspeed_process(env: LaunchEnvironment, timeout_s: int) -> None:
    """Choose DeepSpeed's accelerator; on CPU join the processes over gloo; give a lone process a group of one."""
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        # Must be set before deepspeed chooses (and caches) its accelerator; this is the process's
        # own environment (a torchrun worker, or `supertune train` itself), nothing outside the run sees it.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if env.distributed and cuda:
        return  # accelerate initialises NCCL through deepspeed.comm itself
    import deepspeed

    if deepspeed.comm.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    if env.distributed:
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, timeout=timeout)
        return
    # One process (one GPU with offload, or a try on CPU): DeepSpeed still wants a process group
    # and the launcher variables (it asserts LOCAL_RANK; without them it would look for MPI). Give
    # this process those of a one-process torchrun job, on a free local port.
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(_free_port())),
    ):
        os.environ.setdefault(name, value)
    if cuda:
        torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def correct_accelerate_state(env: LaunchEnvironment) -> None:
    """Write this process's true rank and world size into accelerate's shared state (CPU only; see above).

    Call right after TrainingArguments are built and before the Trainer: the Trainer's Accelerator
    reuses this state for data sharding, gathering and is_main_process.
    """
    import torch
    from accelerate.state import PartialState

    if torch.cuda.is_available() or not env.distributed:
        return
    state = PartialState()
    if state.num_processes == env.world_size and state.process_index == env.rank:
        return  # an accelerate that gets it right needs nothing
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() != env.world_size:
        raise RuntimeError("DeepSpeed on CPU: the process group is not initialised with the launch's world size")
    state.backend = dist.get_backend()
    state.num_processes = dist.get_world_size()
    state.process_index = dist.get_rank()
    state.local_process_index = env.local_rank


def leave_deepspeed_unimported() -> None:
    """For a run that is not DeepSpeed: keep the Trainer from importing DeepSpeed to no purpose.

    accelerate's `extract_model_from_parallel` (called by every Trainer, from its constructor on)
    imports deepspeed whenever the package is installed, to test whether the model is wrapped in a
    DeepSpeedEngine, and DeepSpeed's autotuner imports MLflow with it: seconds of every DDP or FSDP
    process's start (and of every `supertune eval`) for an engine such a run never has. The
    availability check that function reads, in accelerate's `utils.other` only, says no; everything
    else still sees the package. Costs: it leans on accelerate's module layout (pinned), and
    tests/test_trainer_internals.py fails if the check moves and the import comes back.
    """
    import accelerate.utils.other as other

    if hasattr(other, "is_deepspeed_available"):
        other.is_deepspeed_available = lambda: False
