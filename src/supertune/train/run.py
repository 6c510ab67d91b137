"""One training run, start to finish: the library entry point behind `supertune train`."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ..config.schema import RunConfig
from ..data.pipeline import build_training_data
from ..distributed.strategy import prepare_process, shards_parameters
from ..evaluation.generate import generate_text
from ..evaluation.loss import token_mean_loss
from ..launch.environment import LaunchEnvironment, launch_environment
from ..modeling.model import build_model, context_length
from ..modeling.tokenizer import load_tokenizer
from ..rundir import RunDir, write_json_atomic
from .final_model import save_final_model
from .trainer import build_trainer, tokens_per_step

__all__ = ["run_training"]

log = logging.getLogger("supertune")


def run_training(cfg: RunConfig, run: RunDir) -> dict[str, Any]:
    """Train, evaluate, save and sample; returns the summary written to <run dir>/summary.json."""
    from transformers import set_seed

    started = time.time()
    env = launch_environment()
    prepare_process(cfg, env)
    set_seed(cfg.training.seed)
    tokenizer = load_tokenizer(cfg)
    model = build_model(cfg.model, tokenizer)
    data = build_training_data(cfg.data, tokenizer, cfg.training.seed, context_length(model))
    trainer, guard = build_trainer(cfg, run, model, tokenizer, data, env)
    _log_plan(cfg, model, data, env.world_size)
    train_out = trainer.train()
    # Every rank evaluates (its share of the sequences); with sharded parameters every rank must
    # also make the same number of forward calls, which token_mean_loss guarantees.
    eval_loss, eval_tokens = token_mean_loss(trainer.model, data.validation, trainer.data_collator, cfg.training.per_device_eval_batch_size)
    save_final_model(trainer, tokenizer, cfg, run, env)
    summary = _summary(cfg, trainer, train_out, eval_loss, eval_tokens, data, time.time() - started)
    summary["sharding"] = guard.report
    sample = _sample(cfg, trainer, tokenizer, env)
    if env.is_main:
        if sample is not None:
            summary["sample"] = sample
        write_json_atomic(run.summary, summary)
    return summary


def _sample(cfg: RunConfig, trainer: Any, tokenizer: Any, env: LaunchEnvironment) -> str | None:
    """The generated sample: on the main process alone, or on every process together when the
    parameters are sharded (a forward pass then needs all of them); only the main one keeps it."""
    if not (cfg.generate.prompt and cfg.generate.max_new_tokens):
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    if shards_parameters(cfg, env):
        text = generate_text(model, tokenizer, cfg.generate, synced_gpus=True)
        return text if env.is_main else None
    return generate_text(model, tokenizer, cfg.generate) if env.is_main else None


def _summary(
    cfg: RunConfig, trainer: Any, train_out: Any, eval_loss: float, eval_tokens: int, data: Any, wall_s: float
) -> dict[str, Any]:
    runtime = float(train_out.metrics.get("train_runtime", 0.0))
    tokens = int(trainer.state.num_input_tokens_seen or 0)
    return {
        "eval_loss": eval_loss,
        "eval_tokens": eval_tokens,
        "perplexity": math.exp(min(eval_loss, 50.0)),
        "unigram_perplexity": data.unigram_perplexity,
        "train_loss": float(train_out.training_loss),
        "train_steps": int(trainer.state.global_step),
        "train_tokens": tokens,
        "train_runtime_s": runtime,
        "tokens_per_second": tokens / runtime if runtime else 0.0,
        "wall_time_s": wall_s,
        "world_size": trainer.args.world_size,
        "model": cfg.model.name_or_path or "embedded tiny Llama",
    }


def _log_plan(cfg: RunConfig, model: Any, data: Any, world_size: int) -> None:
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    t = cfg.training
    global_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps * world_size
    per_step = tokens_per_step(cfg, world_size)
    log.info(
        "model %.2fM parameters (%.2fM trainable); world size %d; global batch %d sequences%s; training tokens available %s",
        params / 1e6,
        trainable / 1e6,
        world_size,
        global_batch,
        f" = {per_step} tokens per step" if per_step else "",
        data.train_tokens_available if data.train_tokens_available is not None else "unknown (streaming)",
    )
