"""What a run trains and evaluates on, by training.objective: the documents of the data section
(sft), or preference rows with, when the objective has a reference, its log-probabilities; and the
evaluation at the end of the run that goes with each."""

from __future__ import annotations

from typing import Any

from ...config.objectives import OBJECTIVES
from ...config.schema import RunConfig
from ...evaluation.loss import token_mean_loss
from ...launch.environment import LaunchEnvironment
from ...rundir import RunDir
from ...training_data.pipeline import TrainingData, build_training_data
from ...training_data.preference_data import build_preference_data
from ..preference.preference_reference import attach_reference
from ..preference.preference_reference_store import StoredReference
from ..preference.preference_scoring import reference_kind

__all__ = ["build_run_data", "final_evaluation", "is_preference"]


def is_preference(cfg: RunConfig) -> bool:
    return OBJECTIVES[cfg.training.objective].rows != "text"


def build_run_data(
    cfg: RunConfig, model: Any, tokenizer: Any, context_length: int, env: LaunchEnvironment, run: RunDir
) -> TrainingData:
    if not is_preference(cfg):
        return build_training_data(cfg.data, tokenizer, cfg.training.seed, context_length)
    data = build_preference_data(cfg.data, cfg.training.objective, tokenizer, cfg.training.seed, context_length)
    if reference_kind(cfg.training.objective, cfg.model.lora.enabled) == "precomputed":
        import torch

        device = torch.device("cuda", env.device_index) if torch.cuda.is_available() else torch.device("cpu")
        model.to(device)  # where the Trainer puts it next
        batch = cfg.training.per_device_eval_batch_size
        # Kept in the run directory: a resumed or requeued start reads them back instead (when they match).
        # Padded whatever the run's layout: the same numbers with or without packed pairs.
        store = StoredReference(run.reference, writes=env.is_main)
        attach_reference(model, [data.train, data.validation], data.collator.padded(), batch, device, store)
    return data


def final_evaluation(cfg: RunConfig, trainer: Any, data: TrainingData) -> tuple[float, int, dict[str, float]]:
    """(eval_loss, the tokens it is over, the objective's metrics) of the trained model on the validation split."""
    if not is_preference(cfg):
        # Every rank evaluates (its share of the sequences); with sharded parameters every rank must
        # also make the same number of forward calls, which token_mean_loss guarantees.
        loss, tokens = token_mean_loss(
            trainer.model, data.validation, trainer.data_collator, cfg.training.per_device_eval_batch_size
        )
        return loss, tokens, {}
    metrics = trainer.evaluate()
    return float(metrics["eval_loss"]), int(data.validation.loss_tokens), dict(trainer.last_eval_metrics)
