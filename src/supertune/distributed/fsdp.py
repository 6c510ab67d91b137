"""FSDP settings for the Trainer: torch FSDP2 (`fully_shard`) through accelerate, on GPUs only.

Sharding maps onto FSDP2 like this:
- full: parameters, gradients and optimizer state sharded over all processes; parameters are
  re-gathered for the backward pass (reshard_after_forward=True);
- shard_grad_op: the same, but parameters stay gathered between forward and backward
  (reshard_after_forward=False): one all-gather per step saved for a full copy held during it,
  like ZeRO-2;
- hybrid / hybrid_zero2: full / shard_grad_op within a node, replicated across nodes (accelerate's
  ParallelismConfig with dp_replicate_size = nodes, dp_shard_size = processes per node), so the
  sharding traffic stays on the fast intra-node links.
auto_wrap makes every decoder layer (the model's _no_split_modules, e.g. LlamaDecoderLayer) its own
unit, so only one layer is gathered at a time; without it the whole model is one unit.

Not on CPU: accelerate builds FSDP only for accelerator devices and silently trains plain DDP
otherwise (checked in checks.py before launch, and in guard.py after the Trainer's setup).
"""

from __future__ import annotations

from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError
from ..launch.environment import LaunchEnvironment

__all__ = ["fsdp_arguments", "decoder_layer_classes", "refuse_fsdp_without_gpu"]


def refuse_fsdp_without_gpu() -> None:
    """Stop before any work when FSDP is asked on a machine without CUDA (the launch may not come through `supertune train`)."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "distributed.strategy: fsdp needs GPUs and this process sees none (the Trainer would silently run plain DDP); "
            "use distributed.strategy=zero3 to shard on CPU, or ddp"
        )


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


def fsdp_arguments(cfg: RunConfig, model: Any, env: LaunchEnvironment) -> dict[str, Any]:
    """TrainingArguments keywords for distributed.strategy fsdp."""
    f = cfg.distributed.fsdp
    fsdp_config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": f.sharding in ("full", "hybrid"),
        "cpu_offload": f.cpu_offload,
        # The final model is saved from one full state dict gathered on rank 0 (see final_model).
        "state_dict_type": "FULL_STATE_DICT",
    }
    if f.auto_wrap:
        fsdp_config["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
        fsdp_config["transformer_layer_cls_to_wrap"] = decoder_layer_classes(model)
    else:
        fsdp_config["auto_wrap_policy"] = "NO_WRAP"
    kwargs: dict[str, Any] = {"fsdp": True, "fsdp_config": fsdp_config}
    if f.sharding.startswith("hybrid") and env.num_nodes > 1:
        if env.local_world_size < 2:
            raise UserError(
                f"distributed.fsdp.sharding: {f.sharding} shards within a node, and each node runs one process; "
                "use sharding=full, or several GPUs per node"
            )
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(
            dp_replicate_size=env.num_nodes, dp_shard_size=env.local_world_size
        )
    return kwargs
