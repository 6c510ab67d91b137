"""Strategy checks that run with config validation, before any process starts.

Each problem is one line naming the field and the fix. ZeRO configs go through DeepSpeed's own
config classes (the same ones deepspeed.initialize uses); for runs on this machine
(launch.cluster local) DeepSpeed is also asked whether its accelerator and ops can do what the
config needs. Costs: importing deepspeed (about 2 s, plus torch) whenever a zero strategy is
validated, also by `supertune config show`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config.errors import ConfigError
from ..config.schema import RunConfig
from ..errors import first_line
from .deepspeed_json import OFFLOAD_OPTIMIZERS, ZERO_STAGES, deepspeed_config, resolved_for_check

__all__ = ["strategy_problems"]


def strategy_problems(cfg: RunConfig) -> list[str]:
    """Problems of the distributed section that need torch or deepspeed to see."""
    strategy = cfg.distributed.strategy
    local = cfg.launch.cluster == "local"
    problems = _sharded_lora_problems(cfg) if strategy in ("zero3", "fsdp") else []
    if strategy in ZERO_STAGES:
        problems += _zero_problems(cfg, local)
    return problems


def _sharded_lora_problems(cfg: RunConfig) -> list[str]:
    """LoRA saves that need the whole base model on one rank, which sharded parameters do not give."""
    strategy, lora = cfg.distributed.strategy, cfg.model.lora
    if not lora.enabled:
        return []
    problems = []
    if lora.merge_on_save:
        problems.append(
            f"model.lora.merge_on_save: not supported with distributed.strategy={strategy} (the base weights are sharded); "
            "save the adapters (merge_on_save=false) or use zero2"
        )
    if cfg.model.name_or_path is None or cfg.model.from_config:
        problems.append(
            f"model.lora.enabled: adapters on fresh weights need the base model saved too, which {strategy} cannot do from "
            "sharded weights; give pretrained weights in model.name_or_path or use zero2"
        )
    return problems


def _zero_problems(cfg: RunConfig, local: bool) -> list[str]:
    strategy, dist = cfg.distributed.strategy, cfg.distributed
    problems: list[str] = []
    if dist.offload != "none" and cfg.training.optim not in OFFLOAD_OPTIMIZERS:
        problems.append(
            f"training.optim: {cfg.training.optim} cannot run under distributed.offload={dist.offload} "
            "(ZeRO-Offload steps DeepSpeed's CPU AdamW); set training.optim=adamw_torch or distributed.offload=none"
        )
    try:  # the merge needs no DeepSpeed: your own file or settings against the run's values
        config = deepspeed_config(cfg)
    except ConfigError as exc:
        problems += exc.problems
        config = None
    try:
        with _quiet_deepspeed():
            from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        if not local:
            # A job's environment (its container, modules) may differ from this login node's; each
            # process of the job validates the config again there, with DeepSpeed at hand.
            return problems
        return problems + [
            f"distributed.strategy: {strategy} needs DeepSpeed, which is not installed; pip install deepspeed"
        ]
    if config is None:
        return problems
    try:
        with _quiet_deepspeed():
            DeepSpeedConfig(resolved_for_check(config, cfg))
    except Exception as exc:  # DeepSpeed reports with asserts, ValueError and pydantic errors alike
        problems.append(f"distributed.strategy: DeepSpeed rejects this {strategy} setup: {_first_line(exc)}")
    if local:
        problems += _accelerator_problems(cfg)
    return problems


def _accelerator_problems(cfg: RunConfig) -> list[str]:
    """What DeepSpeed's accelerator on this machine says it cannot do for this config."""
    with _quiet_deepspeed():
        accelerator = _accelerator()
        problems: list[str] = []
        name = accelerator.device_name()
        if cfg.training.fp16 and not accelerator.is_fp16_supported():
            problems.append(
                f"training.fp16: DeepSpeed's {name} accelerator does not support fp16 here; use training.bf16=true or fp32"
            )
        if cfg.training.bf16 and not accelerator.is_bf16_supported():
            problems.append(f"training.bf16: DeepSpeed's {name} accelerator does not support bf16 here; use fp32")
        if cfg.distributed.offload == "nvme":
            builder = accelerator.create_op_builder("AsyncIOBuilder")
            if builder is None or not builder.is_compatible(verbose=False):
                problems.append(
                    "distributed.offload: nvme needs DeepSpeed's async_io op, which cannot be built here "
                    "(install libaio-dev, or use distributed.offload=cpu)"
                )
    return problems


def _accelerator() -> Any:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextmanager
def _quiet_deepspeed() -> Iterator[None]:
    """Import deepspeed and let it pick its accelerator without printing; validation prints only problems.

    On a machine without CUDA, DS_ACCELERATOR=cpu is set only while DeepSpeed picks (and caches)
    its accelerator, which skips its probing of other vendors' libraries and the warning that it
    fell back to CPU. Left in os.environ it would reach child processes, including a Slurm job
    submitted from here, where it would force GPU nodes onto the CPU.
    """
    import logging

    added = "DS_ACCELERATOR" not in os.environ and not _cuda_available()
    if added:
        os.environ["DS_ACCELERATOR"] = "cpu"
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    try:
        logger.setLevel(logging.ERROR)
        import deepspeed.runtime.config  # noqa: F401  (creating its logger resets the level)

        logger.setLevel(logging.ERROR)
        _accelerator()
        yield
    finally:
        logger.setLevel(level or logging.INFO)
        if added:
            os.environ.pop("DS_ACCELERATOR", None)


def _first_line(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic (DeepSpeed's config sections): name each field, whose name the first line lacks
        try:
            found = errors()
            return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in found)
        except Exception:  # not pydantic's errors() after all
            pass
    return " ".join(first_line(exc).split())
