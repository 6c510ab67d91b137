"""distributed.strategy in a training process: set the process up, and tell TrainingArguments.

ddp is the Trainer's default data parallelism (nothing to add); zero1/2/3 pass DeepSpeed's JSON,
also written to RunDir.deepspeed_config for the record; fsdp shards the model here (supertune.distributed.fsdp)
and asks the Trainer to save only the model (its sharded checkpoint files are written by
supertune.train.trainer.guarded_trainer).
"""

from __future__ import annotations

from typing import Any

from ..config.schema import RunConfig
from ..launch.environment import LaunchEnvironment
from ..rundir import RunDir, write_json_atomic
from .deepspeed_json import ZERO_STAGES, deepspeed_config
from .deepspeed_runtime import correct_accelerate_state, leave_deepspeed_unimported, start_deepspeed_process
from .fsdp import shard_model
from .process_group import join_restarted_group

__all__ = [
    "uses_deepspeed",
    "shards_parameters",
    "prepare_process",
    "shard_for_strategy",
    "strategy_arguments",
    "after_training_arguments",
]


def uses_deepspeed(cfg: RunConfig) -> bool:
    return cfg.distributed.strategy in ZERO_STAGES


def shards_parameters(cfg: RunConfig, env: LaunchEnvironment) -> bool:
    """True when no rank holds the whole model between forward calls (ZeRO-3, FSDP): every rank must
    then take part in every forward pass, evaluation and generation included."""
    return env.distributed and cfg.distributed.strategy in ("zero3", "fsdp")


def prepare_process(cfg: RunConfig, env: LaunchEnvironment) -> None:
    """Before the model is built: join a restarted process group, start DeepSpeed's communication."""
    join_restarted_group(env, cfg.training.ddp_timeout)
    if uses_deepspeed(cfg):
        start_deepspeed_process(env, cfg.training.ddp_timeout)


def shard_for_strategy(cfg: RunConfig, model: Any, env: LaunchEnvironment) -> None:
    """Before the Trainer sees the model: under fsdp it is sharded here, in place (DeepSpeed shards
    inside the Trainer; ddp replicates)."""
    if cfg.distributed.strategy == "fsdp":
        shard_model(model, cfg, env)


def strategy_arguments(cfg: RunConfig, run: RunDir, env: LaunchEnvironment) -> dict[str, Any]:
    """TrainingArguments keywords of the strategy; the main process also writes the DeepSpeed JSON."""
    if uses_deepspeed(cfg):
        config = deepspeed_config(cfg)
        if env.is_main:
            write_json_atomic(run.deepspeed_config, config)
        # The dict, not the file: no rank may read the file before the main rank has written it.
        return {"deepspeed": config}
    if cfg.distributed.strategy == "fsdp":
        # The Trainer refuses to start with checkpoints of a model sharded before it unless it saves
        # the model alone; the guarded Trainer then writes the sharded model, optimizer, scheduler
        # and RNG states itself.
        return {"save_only_model": True}
    return {}


def after_training_arguments(cfg: RunConfig, env: LaunchEnvironment) -> None:
    """Between TrainingArguments and the Trainer: repair what accelerate records for DeepSpeed on CPU;
    without DeepSpeed, keep the Trainer from importing it."""
    if uses_deepspeed(cfg):
        correct_accelerate_state(env)
    else:
        leave_deepspeed_unimported()
