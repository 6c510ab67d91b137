"""The DeepSpeed config of a ZeRO run, built from the run config alone (no torch, no deepspeed import).

Values the Trainer knows are left as "auto" so that batch size, accumulation, clipping, precision
and the optimizer's hyper-parameters come from the training section and cannot disagree with it;
the Trainer (and accelerate, for the bucket sizes that depend on the model's hidden size) fills
them in when the run starts. `resolved_for_check` fills them the same way ahead of time, so that
DeepSpeed's own config classes can check the result before any process starts.

train_batch_size is left out on purpose: DeepSpeed derives it as micro batch x accumulation x
processes, so one file is right for any process count. (The Trainer would fill an "auto" there
with the process count it saw while its arguments were built, which accelerate gets wrong for
DeepSpeed on CPU; see deepspeed_runtime.)
"""

from __future__ import annotations

from typing import Any

from ..config.schema import RunConfig

__all__ = ["ZERO_STAGES", "OFFLOAD_OPTIMIZERS", "deepspeed_config", "resolved_for_check"]

ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}

# training.optim values that ZeRO-Offload can run as DeepSpeed's own (CPU) AdamW.
OFFLOAD_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_hf")

AUTO = "auto"


def deepspeed_config(cfg: RunConfig) -> dict[str, Any]:
    """The DeepSpeed JSON of cfg (distributed.strategy must be zero1, zero2 or zero3): supertune's own, or,
    with distributed.deepspeed_config or distributed.deepspeed, the user's merged with what must agree
    with the run (supertune.distributed.deepspeed_user; a ConfigError names every conflict)."""
    generated = _generated(cfg)
    if cfg.distributed.deepspeed_config is None and not cfg.distributed.deepspeed:
        return generated
    from .deepspeed_user import user_deepspeed_config

    return user_deepspeed_config(cfg, generated, _offload_target, offload_optimizer())


def _generated(cfg: RunConfig) -> dict[str, Any]:
    dist = cfg.distributed
    stage = ZERO_STAGES[dist.strategy]
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO,
        "gradient_clipping": AUTO,
        "bf16": {"enabled": AUTO},
        "fp16": {"enabled": AUTO},
        "zero_optimization": _zero_section(cfg, stage),
        # DeepSpeed prints its own step line every steps_per_print steps; the Trainer already logs.
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if dist.offload != "none":
        # ZeRO-Offload steps the optimizer on the CPU. DeepSpeed refuses a torch optimizer there
        # (slow for real models) unless forced, so the optimizer is DeepSpeed's own vectorised CPU
        # AdamW, with the Trainer's hyper-parameters. Its C++ kernel is compiled on first use
        # (about a minute, cached in ~/.cache/torch_extensions). The Trainer's LR schedule still runs.
        config["optimizer"] = offload_optimizer()
    return config


def offload_optimizer() -> dict[str, Any]:
    """DeepSpeed's own (CPU) AdamW with the Trainer's hyper-parameters, which ZeRO-Offload steps."""
    return {"type": "AdamW", "params": {"lr": AUTO, "betas": AUTO, "eps": AUTO, "weight_decay": AUTO}}


def _zero_section(cfg: RunConfig, stage: int) -> dict[str, Any]:
    dist = cfg.distributed
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 2:
        # Gradients are reduced in buckets into one contiguous buffer: less fragmentation for one
        # extra copy. "auto" buckets are hidden_size^2 elements (filled from the model's config).
        zero.update(contiguous_gradients=True, overlap_comm=True, reduce_bucket_size=AUTO)
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=AUTO,
            stage3_param_persistence_threshold=AUTO,
            # Gather the partitions into one full 16-bit (the training dtype) state dict on rank 0
            # when the final model is saved, so model/ is a plain Hugging Face checkpoint. Costs one
            # full copy of the weights in rank 0's CPU memory for the moment of the save.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if dist.offload != "none":
        zero["offload_optimizer"] = _offload_target(cfg)
        if stage == 3:
            zero["offload_param"] = _offload_target(cfg)
    return zero


def _offload_target(cfg: RunConfig) -> dict[str, Any]:
    dist = cfg.distributed
    # Pinned host memory makes GPU<->CPU copies asynchronous; on a CPU-only machine DeepSpeed's CPU
    # accelerator treats pinning as a no-op, so the same file serves both.
    target: dict[str, Any] = {"device": dist.offload, "pin_memory": True}
    if dist.offload == "nvme":
        target["nvme_path"] = dist.nvme_path
    return target


def resolved_for_check(config: dict[str, Any], cfg: RunConfig, hidden_size: int = 1024) -> dict[str, Any]:
    """A copy of `config` with every "auto" replaced as the Trainer and accelerate will replace it.

    hidden_size only sizes buckets, which no check depends on; the model is not loaded for it.
    """
    t = cfg.training
    fills: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "gradient_clipping": t.max_grad_norm,
        "bf16.enabled": t.bf16,
        "fp16.enabled": t.fp16,
        "optimizer.params.lr": t.learning_rate,
        "optimizer.params.betas": [t.adam_beta1, t.adam_beta2],
        "optimizer.params.eps": t.adam_epsilon,
        "optimizer.params.weight_decay": t.weight_decay,
        "zero_optimization.reduce_bucket_size": hidden_size * hidden_size,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size,
        # A scheduler section (your own DeepSpeed file) is filled by the Trainer the same way.
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": t.learning_rate,
        "scheduler.params.warmup_num_steps": max(
            1, int(t.warmup_steps if t.warmup_steps >= 1 else t.warmup_steps * max(t.max_steps, 1))
        ),
        "scheduler.params.total_num_steps": max(t.max_steps, 1),
    }
    return _fill(config, fills, "")


def _fill(node: dict[str, Any], fills: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = prefix + key
        if isinstance(value, dict):
            out[key] = _fill(value, fills, path + ".")
        elif value == AUTO:
            if path not in fills:
                raise KeyError(f"no value known for the 'auto' DeepSpeed key {path}")
            out[key] = fills[path]
        else:
            out[key] = value
    return out
