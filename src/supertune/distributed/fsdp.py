"""FSDP: supertune shards the model itself with torch FSDP2 (`fully_shard`) on a device mesh.

The same code runs on CPU (gloo) and on GPUs (NCCL); only the mesh's device type differs. accelerate
is not asked to build FSDP: it does so only for accelerator devices and trains plain DDP elsewhere.
The sharded model is marked `is_distributed_loading_by_transformers`, the Trainer's contract for a
model that already owns its placement and gradient reduction: the Trainer then neither wraps it in
DDP nor shards it again, and FSDP2's reduce-scatter averages the gradients (as DDP's all-reduce).

Sharding maps onto FSDP2 like this:
- full: parameters, gradients and optimizer state sharded over the `dp_shard` mesh dimension;
  parameters re-gathered for the backward pass (reshard_after_forward=True);
- shard_grad_op: the same, but parameters stay gathered between forward and backward
  (reshard_after_forward=False): one all-gather per step saved for a full copy held during it,
  like ZeRO-2;
- hybrid / hybrid_zero2: full / shard_grad_op within a node, replicated across nodes: a 2-D mesh
  (`dp_replicate` = nodes, `dp_shard` = processes per node), so the sharding traffic stays on the
  intra-node links; on one node the same as full / shard_grad_op.
auto_wrap makes every decoder layer (the model's _no_split_modules, e.g. LlamaDecoderLayer) its own
unit, so only one layer is gathered at a time; without it the whole model is one unit.
cpu_offload keeps the sharded parameters, gradients and optimizer state in CPU memory (FSDP2
CPUOffloadPolicy); the optimizer step then runs on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError
from ..launch.environment import LaunchEnvironment
from .process_group import join_group

__all__ = ["decoder_layer_classes", "fsdp_mesh", "shard_model", "mesh_shape", "deferred_gradient_reduction"]


def decoder_layer_classes(model: Any) -> list[str]:
    """Class names of the model's repeated blocks, as transformers declares them (_no_split_modules)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = list(getattr(base, "_no_split_modules", None) or [])
    if not names:
        raise UserError(
            f"distributed.fsdp.auto_wrap: {type(base).__name__} does not name its decoder layers (_no_split_modules); "
            "set distributed.fsdp.auto_wrap=false"
        )
    return names


def fsdp_mesh(cfg: RunConfig, env: LaunchEnvironment) -> Any:
    """The device mesh the model is sharded on: ("dp_shard",) of all processes, or for hybrid sharding
    over several nodes ("dp_replicate", "dp_shard") = (nodes, processes per node)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        # fully_shard moves each shard to the mesh's current device: this process's GPU, chosen here
        # because accelerate (which would choose it) starts only after the model is sharded.
        torch.cuda.set_device(env.local_rank)
    sharding = cfg.distributed.fsdp.sharding
    if sharding.startswith("hybrid") and env.num_nodes > 1:
        if env.local_world_size < 2:
            raise UserError(
                f"distributed.fsdp.sharding: {sharding} shards within a node, and each node runs one process; "
                "use sharding=full, or several processes per node"
            )
        if env.num_nodes * env.local_world_size != env.world_size:
            raise UserError(
                f"distributed.fsdp.sharding: {sharding} needs the same number of processes on every node "
                f"({env.world_size} processes over {env.num_nodes} nodes of {env.local_world_size}); use sharding=full"
            )
        return init_device_mesh(
            device_type, (env.num_nodes, env.local_world_size), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    return init_device_mesh(device_type, (env.world_size,), mesh_dim_names=("dp_shard",))


def shard_model(model: Any, cfg: RunConfig, env: LaunchEnvironment) -> Any:
    """Shard `model` in place with fully_shard (decoder layers first when auto_wrap, then the root) and
    hand it to the Trainer as a model that owns its placement and gradient reduction.

    Costs: each process builds the whole model once in CPU memory before it is sharded (as under
    ZeRO-3 without zero.Init); after this call it holds 1/dp_shard of the parameters.
    """
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

    # One process is allowed: nothing is split, but the run takes the very path of a sharded one
    # (DTensor parameters, the NCCL group on a GPU, the gathered save); what a single lent GPU can verify.
    join_group(cfg.training.ddp_timeout, alone=not env.distributed)
    f = cfg.distributed.fsdp
    mesh = fsdp_mesh(cfg, env)
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": f.sharding in ("full", "hybrid"),
        # Pinned host memory needs an accelerator; on CPU there is nothing to pin.
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if f.cpu_offload else OffloadPolicy(),
    }
    if f.auto_wrap:
        names = set(decoder_layer_classes(model))
        layers = [m for m in model.modules() if type(m).__name__ in names]
        if not layers:
            raise UserError(
                f"distributed.fsdp.auto_wrap: no module of the model is a {', '.join(sorted(names))}; set distributed.fsdp.auto_wrap=false"
            )
        for layer in layers:
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # generate() reads the parameters outside forward(): gather them around it as around forward.
    if hasattr(model, "generate"):
        register_fsdp_forward_method(model, "generate")
    # The flag transformers' own load-time sharding sets (read through the property
    # `is_distributed_loading_by_transformers`, also through a PEFT wrapper): the Trainer then
    # neither wraps the model in DDP nor prepares it for FSDP again. A transformers that stops
    # reading it would wrap the model in DDP, which the guard refuses.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base._is_distributed_loading_by_transformers = True
    return model


def mesh_shape(model: Any) -> dict[str, int]:
    """The mesh the model's parameters are sharded on, dimension name -> size ({} when none is a DTensor)."""
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return dict(zip(mesh.mesh_dim_names or (), mesh.shape))
    return {}


@contextmanager
def deferred_gradient_reduction(model: Any) -> Iterator[None]:
    """The micro-batches of a step before its last: gradients are not reduced until the last one.

    On a 1-D mesh the whole reduction waits: each rank accumulates unsharded gradients (one full copy
    for the length of the step) and reduce-scatters once. With hybrid sharding only the all-reduce
    across nodes waits; the reduce-scatter within a node runs per micro-batch, so gradients stay
    sharded and only the slow inter-node traffic is saved.
    """
    if "dp_replicate" in mesh_shape(model):
        model.set_requires_all_reduce(False)
    else:
        model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # also turns the all-reduce back on
