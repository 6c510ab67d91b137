"""The Trainer of a preference run: GuardedTrainer (checkpoints, NaN guard, resume, requeue) whose
loss is the objective's (supertune.train.preference.preference_losses) instead of the model's own.

The reference model is never a second copy: with LoRA it is the base with the adapter switched off
(peft's disable_adapter); in full fine-tuning its log-probabilities are computed once with the
start model before training (supertune.train.preference.preference_reference) and come with each batch. ORPO
and SimPO have none.

The metrics (TRL's names) are summed per micro-batch in a tensor on the device, without a sync, and
averaged over every pair since the last log (over the processes: one all-reduce) when the Trainer logs:
`rewards/...` with the training loss, `eval_rewards/...` with an evaluation's loss.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ...config.objectives import OBJECTIVES
from ...config.schema import TrainingConfig
from ..trainer.guarded_trainer import GuardedTrainer
from .preference_losses import LOSSES, LossOutput, PairLogps, UnpairedLogps, sequence_logps

__all__ = ["METRIC_NAMES", "PreferenceSettings", "PreferenceTrainer", "reference_kind"]

METRIC_NAMES = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
    "nll_loss",
    "log_odds_ratio",
    "kl",
)
"""Every metric a preference loss may give, in a fixed order: every process reduces the same tensor."""


def reference_kind(objective: str, lora: bool) -> str | None:
    """Where an objective's reference log-probabilities come from: "adapter_off" (LoRA), "precomputed"
    (full fine-tuning), or None (no reference)."""
    if not OBJECTIVES[objective].reference:
        return None
    return "adapter_off" if lora else "precomputed"


@dataclass
class PreferenceSettings:
    training: TrainingConfig
    reference: str | None
    """reference_kind()'s answer for the run."""


class PreferenceTrainer(GuardedTrainer):
    preference: PreferenceSettings
    _sums: dict[str, torch.Tensor]
    last_eval_metrics: dict[str, float]

    def setup_preference(self, settings: PreferenceSettings) -> None:
        self.preference = settings
        # The loss is a mean over the micro-batch's pairs: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._sums = {}
        self.last_eval_metrics = {}

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
        t = self.preference.training
        logps, tokens = self._logps(model, inputs, "")
        reference = self._reference(inputs, "")
        if "desirable" not in inputs:
            b = logps.shape[0] // 2
            pairs = PairLogps(logps[:b], logps[b:], tokens[:b], tokens[b:])
            if reference is not None:
                pairs.ref_chosen, pairs.ref_rejected = reference[:b], reference[b:]
            return _float32(LOSSES[t.objective](pairs, t))
        with torch.no_grad():
            kl_logps, _ = self._logps(model, inputs, "kl_")
        kl_reference = self._reference(inputs, "kl_")
        if reference is None or kl_reference is None:
            raise ValueError("training.objective=kto needs reference log-probabilities, and the batch has none")
        kl = (kl_logps - kl_reference).mean().detach()
        if self.args.world_size > 1:  # the estimate of the whole global micro-batch, as every process sees it
            kl = self.accelerator.gather(kl.reshape(1)).mean()
        rows = UnpairedLogps(logps, reference, inputs["desirable"], kl.clamp(min=0))
        return _float32(LOSSES[t.objective](rows, t))

    def _logps(self, model: Any, inputs: dict[str, Any], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not torch.is_grad_enabled():
            model = self.accelerator.unwrap_model(model)  # no gradients: no need for DDP's bookkeeping
        logits = model(input_ids=inputs[f"{prefix}input_ids"], attention_mask=inputs[f"{prefix}attention_mask"]).logits
        return sequence_logps(logits, inputs[f"{prefix}labels"])

    def _reference(self, inputs: dict[str, Any], prefix: str) -> torch.Tensor | None:
        kind = self.preference.reference
        if kind == "precomputed":
            return inputs[f"ref_{prefix}logps"].double()
        if kind != "adapter_off":
            return None
        base = self.accelerator.unwrap_model(self.model)
        with torch.no_grad(), base.disable_adapter() if hasattr(base, "disable_adapter") else nullcontext():
            was_training = base.training
            base.eval()  # the reference has no dropout, as its precomputed log-probabilities have none
            try:
                logits = base(
                    input_ids=inputs[f"{prefix}input_ids"], attention_mask=inputs[f"{prefix}attention_mask"]
                ).logits
            finally:
                base.train(was_training)
        return sequence_logps(logits, inputs[f"{prefix}labels"])[0]

    # -- metrics ----------------------------------------------------------------------------------

    def _add(self, kind: str, out: LossOutput) -> None:
        """Each metric's sum over the rows it is a mean of, and their count: the logged value is the
        mean over every pair (row) since the last log, whatever the batches were."""
        sums = self._sums.get(kind)
        if sums is None:
            sums = self._sums[kind] = torch.zeros(2, len(METRIC_NAMES), dtype=torch.float64, device=self.args.device)
        for name, value in out.metrics.items():
            i = METRIC_NAMES.index(name)
            rows = torch.as_tensor(out.counts.get(name, out.rows), dtype=torch.float64, device=sums.device)
            sums[0, i] += value.detach().to(sums.device, torch.float64) * rows
            sums[1, i] += rows

    def _averaged(self, kind: str) -> dict[str, float]:
        sums = self._sums.pop(kind, None)
        if sums is None:
            sums = torch.zeros(2, len(METRIC_NAMES), dtype=torch.float64, device=self.args.device)
        if self.args.world_size > 1:  # every process logs together; the same tensor shape on each
            sums = self.accelerator.reduce(sums, reduction="sum")
        values = (sums[0] / sums[1].clamp(min=1)).tolist()
        counts = sums[1].tolist()
        return {name: v for name, v, n in zip(METRIC_NAMES, values, counts) if n > 0}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(self._averaged("train"))
        elif "eval_loss" in logs:
            self.last_eval_metrics = {f"eval_{k}": v for k, v in self._averaged("eval").items()}
            logs.update(self.last_eval_metrics)
        super().log(logs, start_time)


def _float32(out: LossOutput) -> LossOutput:
    """The loss the Trainer steps with in float32, as a model's own loss is (it is computed in float64)."""
    out.loss = out.loss.float()
    return out
