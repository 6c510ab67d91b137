"""The Trainer of a preference run: GuardedTrainer (checkpoints, NaN guard, resume, requeue) whose
loss is the objective's (supertune.train.preference.preference_losses) instead of the model's own.

The reference model is never a second copy: with LoRA it is the base with the adapter switched off
(peft's disable_adapter); in full fine-tuning its log-probabilities are computed once with the
start model before training (supertune.train.preference.preference_reference) and come with each batch. ORPO
and SimPO have none.

The metrics (TRL's names) are summed per micro-batch in a tensor on the device, without a sync, and
averaged over every pair since the last log (over the processes: one all-reduce) when the Trainer logs:
`rewards/...` with the training loss, `eval_rewards/...` with an evaluation's loss. How a batch is
scored and the metrics averaged is supertune.train.preference.preference_scoring's, which `supertune eval`
uses too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...config.schema import TrainingConfig
from ..trainer.guarded_trainer import GuardedTrainer
from .preference_losses import LossOutput
from .preference_scoring import METRIC_NAMES, MetricSums, PreferenceScorer, reference_kind

__all__ = ["METRIC_NAMES", "PreferenceSettings", "PreferenceTrainer", "reference_kind"]


@dataclass
class PreferenceSettings:
    training: TrainingConfig
    reference: str | None
    """reference_kind()'s answer for the run."""


class PreferenceTrainer(GuardedTrainer):
    preference: PreferenceSettings
    _sums: dict[str, MetricSums]
    _scorer: PreferenceScorer
    last_eval_metrics: dict[str, float]

    def setup_preference(self, settings: PreferenceSettings) -> None:
        self.preference = settings
        # The loss is a mean over the micro-batch's pairs: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._sums = {}
        self.last_eval_metrics = {}
        gather = (lambda kl: self.accelerator.gather(kl.reshape(1)).mean()) if self.args.world_size > 1 else None
        self._scorer = PreferenceScorer(settings.training, settings.reference, self.accelerator.unwrap_model, gather)

    # -- the loss ---------------------------------------------------------------------------------

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        out = self.preference_loss(model, inputs)
        self._add("train" if model.training else "eval", out)
        return (out.loss, None) if return_outputs else out.loss

    def prediction_step(
        self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: list[str] | None = None
    ) -> tuple[Any, Any, Any]:
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            out = self.preference_loss(model, inputs)
        self._add("eval", out)
        return out.loss.detach(), None, None

    def preference_loss(self, model: Any, inputs: dict[str, Any]) -> LossOutput:
        """The objective's loss and metrics on one batch of PreferenceCollator."""
        return self._scorer.loss(model, inputs)

    # -- metrics ----------------------------------------------------------------------------------

    def _add(self, kind: str, out: LossOutput) -> None:
        """The batch's metrics join the sums of `kind` ("train" or "eval") since the last log."""
        sums = self._sums.get(kind)
        if sums is None:
            sums = self._sums[kind] = MetricSums(self.args.device)
        sums.add(out)

    def _averaged(self, kind: str) -> dict[str, float]:
        sums = self._sums.pop(kind, None) or MetricSums(self.args.device)
        # Every process logs together, the same tensor shape on each.
        reduce = (lambda t: self.accelerator.reduce(t, reduction="sum")) if self.args.world_size > 1 else None
        return sums.averaged(reduce)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(self._averaged("train"))
        elif "eval_loss" in logs:
            self.last_eval_metrics = {f"eval_{k}": v for k, v in self._averaged("eval").items()}
            logs.update(self.last_eval_metrics)
        super().log(logs, start_time)
