"""After the Trainer has wrapped the model: is it really the strategy that was asked for?

accelerate falls back silently in places (FSDP without an accelerator becomes DDP; DeepSpeed on
CPU once recorded a single process), so every run checks the wrapped model before its first step
and stops with one line when it differs. The check also measures how much of the model this rank
holds, which ends up in summary.json as proof of sharding.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ..config.schema import RunConfig
from ..errors import UserError
from .deepspeed_json import ZERO_STAGES

__all__ = ["StrategyGuard", "check_wrapped", "held_fraction"]


class StrategyGuard(TrainerCallback):
    """Runs `check_wrapped` when training begins; `report` holds what it found."""

    def __init__(self, cfg: RunConfig, world_size: int) -> None:
        self.cfg = cfg
        self.world_size = world_size
        self.trainer: Any = None  # set once the Trainer exists (callbacks are built before it)
        self.report: dict[str, Any] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        t = self.trainer
        d = self.cfg.distributed
        self.report = check_wrapped(
            d.strategy, t.model_wrapped, t.model, t.accelerator.num_processes, self.world_size, d.offload
        )


def check_wrapped(
    strategy: str, wrapped: Any, model: Any, accelerator_processes: int, world_size: int, offload: str = "none"
) -> dict[str, Any]:
    """Raise UserError unless `wrapped` implements `strategy` (and ZeRO `offload`) over `world_size` processes; else describe it."""
    if accelerator_processes != world_size:
        _refuse(strategy, f"the Trainer sees {accelerator_processes} process(es) of {world_size}")
    wrapped = getattr(wrapped, "_orig_mod", wrapped)  # training.torch_compile puts the wrapper inside
    found = type(wrapped).__name__
    report: dict[str, Any] = {"strategy": strategy, "wrapper": found, "world_size": world_size}
    if strategy in ZERO_STAGES:
        from deepspeed import DeepSpeedEngine

        if not isinstance(wrapped, DeepSpeedEngine):
            _refuse(strategy, f"the model is wrapped as {found}, not a DeepSpeedEngine")
        stage = wrapped.zero_optimization_stage()
        if stage != ZERO_STAGES[strategy]:
            _refuse(strategy, f"DeepSpeed runs ZeRO stage {stage}")
        report["zero_stage"] = stage
        target = wrapped.zero_offload_optimizer()
        device = getattr(target.device, "value", target.device) if target is not None else "none"
        if str(device) != offload:
            _refuse(strategy, f"DeepSpeed offloads the optimizer to {device}, not {offload}")
        report["offload"] = str(device)
    elif strategy == "fsdp":
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(getattr(model, "_orig_mod", model), FSDPModule):
            _refuse(strategy, f"the model is wrapped as {found}, not by FSDP")
    elif world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(wrapped, DistributedDataParallel):
            _refuse(strategy, f"the model is wrapped as {found}, not DistributedDataParallel")
    report["held_fraction"] = held_fraction(strategy, wrapped, model)
    return report


def held_fraction(strategy: str, wrapped: Any, model: Any) -> float:
    """Share of the sharded state this rank holds: 1.0 when replicated, about 1/world when sharded.

    ZeRO-3 and FSDP: parameters; ZeRO-1/2: the fp32 optimizer copy of the trainable parameters.
    """
    if strategy == "zero3":
        params = list(model.parameters())
        return sum(p.ds_tensor.numel() for p in params) / max(sum(p.ds_numel for p in params), 1)
    if strategy in ("zero1", "zero2"):
        groups = getattr(wrapped.optimizer, "single_partition_of_fp32_groups", None)
        if groups is None:
            return 1.0
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return sum(g.numel() for g in groups) / max(trainable, 1)
    if strategy == "fsdp":
        params = list(model.parameters())
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
        return local / max(sum(p.numel() for p in params), 1)
    return 1.0


def _refuse(strategy: str, what: str) -> None:
    raise UserError(
        f"distributed.strategy: {strategy} was asked but {what}; stopping rather than training something else "
        "(a library version supertune does not know?)"
    )
