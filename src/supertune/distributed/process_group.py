"""The process group of processes that a torchrun agent restarted after a failure.

torchrun (2.13) gives restarted workers the same store, where the first attempt's processes left
their gloo addresses under the same keys: the new processes read them, connect to ports of dead
processes and fail ("Gloo connectFullMesh failed ... Connection refused"), or wait until the
collective timeout. Restarted processes therefore join under a prefix of their attempt number,
before accelerate or DeepSpeed would create the group (both use an existing one).
"""

from __future__ import annotations

from datetime import timedelta

from ..launch.environment import LaunchEnvironment

__all__ = ["join_restarted_group", "join_group", "leave_process_group"]


def join_restarted_group(env: LaunchEnvironment, timeout_s: int) -> None:
    """Create the default process group under a per-attempt store prefix (restarted processes only)."""
    if env.restart_count == 0 or not env.distributed:
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    # env:// yields the store the launcher set up (the agent's, or rank 0's) with rank and size.
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"supertune/attempt-{env.restart_count}", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def join_group(timeout_s: int, alone: bool = False) -> None:
    """Create the default process group from the launch's env:// (unless one exists): gloo on CPU,
    NCCL for CUDA tensors with gloo beside it for CPU ones. accelerate would create the same group
    later; FSDP needs it earlier, to build its device mesh before the Trainer exists.

    `alone`: a group of this one process, with an in-memory store (no launcher, no port)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if alone:
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=timeout_s)
        )
        return
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def leave_process_group() -> None:
    """Destroy the default process group before the interpreter exits.

    Left to the interpreter's exit, gloo's threads are torn down in no particular order, and a worker
    now and then dies of SIGABRT ("terminate called without an active exception") after its run has
    finished and saved; seen in processes restarted by torchrun. Destroying the group first joins them.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
