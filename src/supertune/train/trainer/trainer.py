"""The Trainer of a run (supertune.train.trainer.guarded_trainer), with supertune's callbacks and collators."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ...benchmarks import BenchmarkCallback
from ...checkpoints.layout import CheckpointDir
from ...config.schema import RunConfig
from ...distributed.guard import StrategyGuard
from ...distributed.strategy import after_training_arguments, shard_for_strategy, strategy_arguments
from ...launch.environment import LaunchEnvironment
from ...rundir import RunDir
from ...telemetry.callback import Telemetry
from ...tracking.session import Tracking
from ...training_data.pipeline import TrainingData
from ..data.global_batch_data import whole_global_batches
from ..data.loss_tokens import LossTokenCount
from ..lifecycle.arguments import training_arguments
from ..lifecycle.logging_setup import quiet_trainer_dicts, verbose_logs
from ..preference.preference_trainer import PreferenceSettings, PreferenceTrainer, reference_kind
from .callbacks import MetricsFile, publish_scores, tensorboard_callback
from .guarded_trainer import CheckpointSettings, GuardedTrainer
from .progress import ProgressLines, progress_bar_wanted
from .stopping import RunGuard
from .trainer_internals import internals_problems

__all__ = ["build_trainer", "tokens_per_step", "global_batch"]

log = logging.getLogger("supertune")


def tokens_per_step(cfg: RunConfig, world_size: int) -> int | None:
    """Tokens in one optimizer step when every sequence is full (packing); None for padded batches
    (and preference rows, which are padded)."""
    if not cfg.data.packing or cfg.training.objective != "sft":
        return None
    return global_batch(cfg, world_size) * cfg.data.block_size


def global_batch(cfg: RunConfig, world_size: int) -> int:
    """Sequences in one optimizer step over all processes."""
    t = cfg.training
    return t.per_device_train_batch_size * t.gradient_accumulation_steps * world_size


def build_trainer(
    cfg: RunConfig,
    run: RunDir,
    model: Any,
    tokenizer: Any,
    data: TrainingData,
    env: LaunchEnvironment,
    speed_arguments: dict[str, Any] | None = None,
) -> tuple[Any, StrategyGuard]:
    """The Trainer (its RunGuard, which stops the run on request or on a NaN, is trainer.supertune.guard),
    and the guard that checks (when training begins) that the model is wrapped as distributed.strategy asks.
    trainer.telemetry measures throughput and MFU (supertune.telemetry); trainer.tracking logs to
    W&B and MLflow (supertune.tracking), and run_training closes it. `speed_arguments`: the
    TrainingArguments keywords of training.speed's speed-ups (supertune.modeling.speed)."""
    from transformers import default_data_collator

    layout = CheckpointDir(run.checkpoints)
    guard = StrategyGuard(cfg, env.world_size)
    run_guard = RunGuard(run, env.rank, lambda: latest.name if (latest := layout.latest()) else None)
    telemetry = Telemetry.for_run(cfg, model, data, env)
    tracking = Tracking.for_run(cfg, run, env, telemetry.devices)  # W&B, MLflow: main process only
    # telemetry.fields first: it adds throughput and MFU to the log records the others write.
    callbacks: list[Any] = [
        telemetry.fields,
        MetricsFile(run.metrics, tokens_per_step(cfg, env.world_size)),
        tracking.callback,
        guard,
        run_guard,
    ]
    if not progress_bar_wanted():
        callbacks.append(ProgressLines(cfg.output.progress_seconds))
    # Only the main process writes TensorBoard events; a writer on every rank leaves empty files behind.
    if env.is_main and "tensorboard" in cfg.training.report_to:
        callbacks.append(tensorboard_callback(run.tensorboard))
    if cfg.evaluation.every_steps and env.is_main:
        callbacks.append(
            BenchmarkCallback(
                cfg.evaluation, tokenizer, run, lambda step, scores: publish_scores(run, tracking, step, scores)
            )
        )
    callbacks.append(telemetry.clock)  # last: a step's time includes the other callbacks' work
    for problem in internals_problems() if env.is_main else ():
        log.warning(
            "%s; checkpoints or NaN checks may not work: use the transformers version in pinned-requirements.txt",
            problem,
        )
    shard_for_strategy(cfg, model, env)
    args = training_arguments(cfg, run, {**strategy_arguments(cfg, run, env), **(speed_arguments or {})})
    after_training_arguments(cfg, env)
    preference = cfg.training.objective != "sft"
    trainer = (PreferenceTrainer if preference else GuardedTrainer)(
        model=model,
        args=args,
        train_dataset=whole_global_batches(data.train, cfg.training.global_batch_size),
        eval_dataset=data.validation,
        data_collator=data.collator or default_data_collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    if not verbose_logs():
        quiet_trainer_dicts(trainer)
    trainer.supertune = CheckpointSettings(
        layout=layout,
        config_file=run.config,
        keep=cfg.training.save_total_limit,
        global_batch=global_batch(cfg, env.world_size),
        rank=env.rank,
        guard=run_guard,
        init_optimizer_from=Path(cfg.training.init_optimizer_from) if cfg.training.init_optimizer_from else None,
    )
    trainer.loss_tokens = LossTokenCount()
    if preference:
        trainer.setup_preference(
            PreferenceSettings(cfg.training, reference_kind(cfg.training.objective, cfg.model.lora.enabled))
        )
    trainer.telemetry = telemetry
    trainer.tracking = tracking
    guard.trainer = trainer
    return trainer, guard
