"""One training run, start to finish: the library entry point behind `supertune train`."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ...benchmarks import check_tasks, flat_scores, record, score_model
from ...checkpoints.faults import fault_point
from ...config.schema import RunConfig
from ...distributed.strategy import prepare_process, shards_parameters
from ...evaluation.generate import generate_reply, generate_text
from ...launch.environment import LaunchEnvironment, launch_environment
from ...modeling.checkpointing import checkpointed_layers
from ...modeling.decoder_layers import decoder_layers
from ...modeling.float8 import refuse_float8_device
from ...modeling.model import build_model, context_length
from ...modeling.speed import RunFacts, take_speedups
from ...modeling.tokenizer import load_tokenizer
from ...resolve.global_batch import fit_global_batch
from ...rundir import RunDir, write_json_atomic
from ..data.run_data import build_run_data, final_evaluation, is_preference
from ..trainer.callbacks import append_event, publish_scores
from ..trainer.trainer import build_trainer, tokens_per_step
from .final_model import save_final_model
from .resume import choose_checkpoint

__all__ = ["run_training"]

log = logging.getLogger("supertune")


def run_training(cfg: RunConfig, run: RunDir) -> dict[str, Any]:
    """Train (resuming from the run's latest good checkpoint), evaluate, save and sample; returns
    the summary written to <run dir>/summary.json, or, when the run was asked to stop and saved a
    checkpoint instead of finishing, the record written to <run dir>/stopped.json (key "stopped")."""
    from transformers import set_seed

    started = time.time()
    env = launch_environment()
    cfg = fit_global_batch(cfg, env.world_size)  # training.global_batch_size against this launch's process count
    prepare_process(cfg, env)
    set_seed(cfg.training.seed)
    tokenizer = load_tokenizer(cfg)
    if cfg.training.float8:
        refuse_float8_device()  # in each process, before the model is built: this node's GPU
    model = build_model(cfg.model, tokenizer, document_mask=cfg.data.packing and cfg.data.document_mask)
    speed = take_speedups(model, cfg.training.speed, cfg.training.speed_skip, _run_facts(cfg), cfg.training.float8)
    if env.is_main:
        log.info("%s", speed.line())
    data = build_run_data(cfg, model, tokenizer, context_length(model), env, run)
    if cfg.evaluation.tasks and env.is_main:
        check_tasks(cfg.evaluation.tasks, "evaluation.tasks")  # a missing dataset now, not after the training
    trainer, guard = build_trainer(cfg, run, model, tokenizer, data, env, speed.trainer_arguments)
    try:
        summary = _train_and_finish(cfg, run, model, trainer, guard, tokenizer, data, env, started, speed.record())
    except BaseException:
        trainer.tracking.close("failed")
        raise
    if summary.get("stopped"):
        trainer.tracking.close("stopped", summary["step"])
    else:
        trainer.tracking.close("finished", summary["train_steps"], summary)
    return summary


def _run_facts(cfg: RunConfig) -> RunFacts:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return RunFacts(
        strategy=cfg.distributed.strategy,
        device=device,
        optim=cfg.training.optim,
        document_mask=cfg.data.packing and cfg.data.document_mask,
        torch_compile=cfg.training.torch_compile,
    )


def _train_and_finish(
    cfg: RunConfig,
    run: RunDir,
    model: Any,
    trainer: Any,
    guard: Any,
    tokenizer: Any,
    data: Any,
    env: LaunchEnvironment,
    started: float,
    speed: dict[str, Any],
) -> dict[str, Any]:
    """Train, evaluate, save and sample: the summary, or the stop record of a run stopped on request."""
    _log_plan(cfg, model, data, env.world_size, trainer.telemetry)
    train_out, resumed = _train_or_resume(cfg, trainer, env)
    if trainer.supertune.guard.stopped is not None:
        return _stopped(run, trainer, trainer.supertune.guard.stopped, env)
    eval_loss, eval_tokens, eval_metrics = final_evaluation(cfg, trainer, data)
    save_final_model(trainer, tokenizer, cfg, run, env)
    fault_point("final.model", trainer.state.global_step, env.rank)
    summary = _summary(cfg, trainer, train_out, eval_loss, eval_tokens, data, time.time() - started, resumed)
    summary.update(eval_metrics)  # a preference objective's eval_rewards/... (TRL's names)
    summary["sharding"] = guard.report
    summary["speed"] = speed  # training.speed: what was taken, and why the rest was left out
    if cfg.evaluation.tasks and env.is_main:
        summary["benchmarks"] = _benchmarks(cfg, run, trainer, tokenizer, env)
    sample = _sample(cfg, trainer, tokenizer, env)
    if env.is_main:
        if sample is not None:
            summary["sample"] = sample
        write_json_atomic(run.summary, summary)
    return summary


def _train_or_resume(cfg: RunConfig, trainer: Any, env: LaunchEnvironment) -> tuple[Any, Any]:
    """Train from the run's latest good checkpoint, or from the start; (train output, manifest or None)."""
    found = choose_checkpoint(trainer.supertune.layout, env.is_main, env.world_size)
    if found is None:
        return trainer.train(), None
    path, manifest = found
    _log_resume(path, manifest, env, trainer.supertune.global_batch)
    trainer.loss_tokens.resumed_at(manifest.loss_tokens)
    fault_point("resume.loaded", manifest.step, env.rank)
    from transformers import TrainerState

    state = TrainerState.load_from_json(str(path / "trainer_state.json"))
    if _training_done(cfg, state):
        return _load_finished(trainer, path, state), manifest
    return trainer.train(resume_from_checkpoint=str(path)), manifest


def _log_resume(path: Any, manifest: Any, env: LaunchEnvironment, global_batch: int) -> None:
    log.info(
        "resuming from %s: step %d, %d tokens seen, %d sequences consumed",
        path.name,
        manifest.step,
        manifest.tokens_seen,
        manifest.samples_seen,
    )
    if manifest.world_size == env.world_size or not env.is_main:
        return
    if manifest.global_batch == global_batch:
        # Each step takes the next global_batch sequences of the same order whatever the process
        # count; only their split over the processes differs (under fsdp, also the shards read back).
        log.info(
            "%s was written by %d processes and this run has %d: the global batch is the same (%d sequences), "
            "so training continues on the same data",
            path.name,
            manifest.world_size,
            env.world_size,
            global_batch,
        )
        return
    log.warning(
        "%s was written by %d processes and this run has %d: training continues, but the data order "
        "differs from an uninterrupted run",
        path.name,
        manifest.world_size,
        env.world_size,
    )


def _training_done(cfg: RunConfig, state: Any) -> bool:
    """Whether a checkpoint's trainer state holds the last step already: the Trainer, resumed there, would train one more."""
    planned = cfg.training.max_steps if cfg.training.max_steps > 0 else int(state.max_steps or 0)
    return int(state.global_step) >= planned > 0


def _load_finished(trainer: Any, checkpoint: Any, state: Any) -> Any:
    """Weights and trainer state of a checkpoint written at the last step, for evaluation and saving."""
    from transformers.trainer_utils import TrainOutput

    trainer._load_from_checkpoint(str(checkpoint))
    trainer.state = state
    # The Trainer's training_loss is the mean over all steps; the logged losses (one per
    # logging_steps) are what the checkpoint keeps of it.
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    log.info(
        "%s holds the last step (%d): evaluating and saving without training",
        checkpoint.name,
        trainer.state.global_step,
    )
    return TrainOutput(
        trainer.state.global_step, sum(losses) / len(losses) if losses else float("nan"), {"train_runtime": 0.0}
    )


def _stopped(run: RunDir, trainer: Any, reason: str, env: LaunchEnvironment) -> dict[str, Any]:
    """Record a stop on request: the checkpoint of this step is published; run again to resume."""
    step = int(trainer.state.global_step)
    record = {
        "stopped": True,
        "reason": reason,
        "step": step,
        "checkpoint": f"checkpoint-{step}",
        "unix_time": time.time(),
    }
    if env.is_main:
        append_event(run.metrics, {"event": "stopped", "step": step, "reason": reason})
        write_json_atomic(run.stopped, record)
    log.info(
        "stopped at step %d on %s; checkpoint-%d is saved: run the same command again to resume", step, reason, step
    )
    return record


def _benchmarks(cfg: RunConfig, run: RunDir, trainer: Any, tokenizer: Any, env: LaunchEnvironment) -> dict:
    """evaluation.tasks on the trained model, on the main process: the model in memory, or, when the
    parameters are sharded over the processes, the saved model read back whole (validation asks for
    output.save_model then)."""
    step = int(trainer.state.global_step)
    if shards_parameters(cfg, env):
        from transformers import AutoModelForCausalLM

        model, where = AutoModelForCausalLM.from_pretrained(str(run.model)), "model"
    else:
        model, where = trainer.accelerator.unwrap_model(trainer.model), "trained"
    scores = score_model(model, tokenizer, cfg.evaluation, cfg.evaluation.tasks, "evaluation.tasks")
    record(run, scores, step=step, model=where)
    publish_scores(run, trainer.tracking, step, flat_scores(scores))
    return scores


def _sample(cfg: RunConfig, trainer: Any, tokenizer: Any, env: LaunchEnvironment) -> str | None:
    """The generated sample: on the main process alone, or on every process together when the
    parameters are sharded (a forward pass then needs all of them); only the main one keeps it."""
    if not (cfg.generate.prompt and cfg.generate.max_new_tokens):
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    synced = shards_parameters(cfg, env)
    if not (env.is_main or synced):
        return None
    if cfg.data.format == "chat" or (is_preference(cfg) and cfg.data.embedded):
        text = _chat_sample(cfg, model, tokenizer, synced)
    else:
        text = generate_text(model, tokenizer, cfg.generate, synced_gpus=synced)
    return text if env.is_main else None


def _chat_sample(cfg: RunConfig, model: Any, tokenizer: Any, synced: bool) -> str:
    """A chat run's sample: the answer to a question about a town of no split (the embedded
    conversations), or to generate.prompt as a user turn; the conversation and the answer, one line each."""
    from ...embedded import sample_conversation

    messages = sample_conversation() if cfg.data.embedded else [{"role": "user", "content": cfg.generate.prompt}]
    answer = generate_reply(model, tokenizer, cfg.generate, messages, synced_gpus=synced)
    return " | ".join(f"{m['role']}: {m['content']}" for m in messages) + f" | assistant: {answer}"


def _summary(
    cfg: RunConfig,
    trainer: Any,
    train_out: Any,
    eval_loss: float,
    eval_tokens: int,
    data: Any,
    wall_s: float,
    resumed: Any,
) -> dict[str, Any]:
    runtime = float(train_out.metrics.get("train_runtime", 0.0))
    tokens = int(trainer.state.num_input_tokens_seen or 0)
    loss_tokens = trainer.loss_tokens_trained()  # every rank calls _summary: an all-reduce
    # After a resume, runtime covers this process's steps only, and so does the rate.
    tokens_now = tokens - (resumed.tokens_seen if resumed else 0)
    return {
        "eval_loss": eval_loss,
        "eval_tokens": eval_tokens,
        # What eval_loss (and train_loss) are over: all tokens, or the answers' (data.loss_on).
        "loss_on": cfg.data.loss_target,
        "objective": cfg.training.objective,
        "loss_tokens_available": data.loss_tokens_available,
        # A preference loss is no token loss: it has no perplexity.
        "perplexity": None if is_preference(cfg) else math.exp(min(eval_loss, 50.0)),
        "unigram_perplexity": data.unigram_perplexity,
        "train_loss": float(train_out.training_loss),
        "train_steps": int(trainer.state.global_step),
        "train_tokens": tokens,
        # The tokens the loss was computed on (supertune.train.data.loss_tokens), of train_tokens read;
        # None after resuming from a checkpoint that did not count them.
        "train_loss_tokens": loss_tokens,
        "train_runtime_s": runtime,
        "tokens_per_second": tokens_now / runtime if runtime else 0.0,
        "resumed_from_step": resumed.step if resumed else None,
        "wall_time_s": wall_s,
        "world_size": trainer.args.world_size,
        # What the Trainer trained with, read back from it rather than from the config.
        "mixed_precision": "bf16" if trainer.args.bf16 else "fp16" if trainer.args.fp16 else "no",
        # data.document_mask: the share of training token slots left as padding (None otherwise).
        "padding_share": data.padding_share,
        "model": cfg.model.name_or_path or "embedded tiny Llama",
        # Throughput, TFLOP/s and MFU over the steps after the first, the FLOP formula and the peak used.
        **trainer.telemetry.summary_fields(),
    }


def _log_plan(cfg: RunConfig, model: Any, data: Any, world_size: int, telemetry: Any) -> None:
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
    if cfg.model.gradient_checkpointing:
        layers, every = len(decoder_layers(model)), cfg.model.gradient_checkpointing_every
        log.info(
            "gradient checkpointing: decoder layers %s of %d recompute their forward (model.gradient_checkpointing_every=%d)",
            ", ".join(map(str, checkpointed_layers(model))) or "none",
            layers,
            every,
        )
    telemetry.log_plan()  # devices, FLOPs per token and the formula, the peak (or why there is no MFU)
