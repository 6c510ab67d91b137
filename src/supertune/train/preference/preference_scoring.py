"""One batch of preference rows scored, and the metrics of many batches averaged: what a preference
run's Trainer steps and evaluates with (supertune.train.preference.preference_trainer) and what
`supertune eval` reports of a saved model (supertune.train.preference.preference_eval), one code for both.

A batch's loss needs the policy's log-probabilities of its answers (one forward pass over chosen and
rejected together, padded or packed: supertune.training_data.preference_batches), the reference's
(carried by the batch when computed once before, or the policy's base with the LoRA adapter
switched off), and, for KTO, the batch's KL estimate (averaged over the processes when there are
several).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ...config.objectives import OBJECTIVES
from ...config.schema import TrainingConfig
from ...training_data.preference_batches import sequence_count
from .preference_losses import LOSSES, LossOutput, PairLogps, UnpairedLogps, sequence_logps

__all__ = ["METRIC_NAMES", "MetricSums", "PreferenceScorer", "batch_logps", "reference_kind"]

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


def _same(model: Any) -> Any:
    return model


@dataclass
class PreferenceScorer:
    """The objective's loss and metrics of one batch of PreferenceCollator."""

    training: TrainingConfig
    reference: str | None
    """reference_kind()'s answer: "precomputed" reads the batch's ref_logps, "adapter_off" runs the model's base."""
    unwrap: Callable[[Any], Any] = _same
    """The model inside a distributed wrapper: passes without gradients need none of its bookkeeping."""
    gather_mean: Callable[[torch.Tensor], torch.Tensor] | None = None
    """KTO's KL estimate averaged over the processes (None on one process)."""

    def loss(self, model: Any, inputs: dict[str, Any]) -> LossOutput:
        t = self.training
        logps, tokens = self._logps(model, inputs, "")
        reference = self._reference(model, inputs, "")
        if "desirable" not in inputs:
            b = logps.shape[0] // 2
            pairs = PairLogps(logps[:b], logps[b:], tokens[:b], tokens[b:])
            if reference is not None:
                pairs.ref_chosen, pairs.ref_rejected = reference[:b], reference[b:]
            return _float32(LOSSES[t.objective](pairs, t))
        with torch.no_grad():
            kl_logps, _ = self._logps(model, inputs, "kl_")
        kl_reference = self._reference(model, inputs, "kl_")
        if reference is None or kl_reference is None:
            raise ValueError("training.objective=kto needs reference log-probabilities, and the batch has none")
        kl = (kl_logps - kl_reference).mean().detach()
        if self.gather_mean is not None:  # the estimate of the whole global micro-batch, as every process sees it
            kl = self.gather_mean(kl)
        rows = UnpairedLogps(logps, reference, inputs["desirable"], kl.clamp(min=0))
        return _float32(LOSSES[t.objective](rows, t))

    def _logps(self, model: Any, inputs: dict[str, Any], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not torch.is_grad_enabled():
            model = self.unwrap(model)
        return batch_logps(model, inputs, prefix)

    def _reference(self, model: Any, inputs: dict[str, Any], prefix: str) -> torch.Tensor | None:
        if self.reference == "precomputed":
            return inputs[f"ref_{prefix}logps"].double()
        if self.reference != "adapter_off":
            return None
        base = self.unwrap(model)
        with torch.no_grad(), base.disable_adapter() if hasattr(base, "disable_adapter") else nullcontext():
            was_training = base.training
            base.eval()  # the reference has no dropout, as its precomputed log-probabilities have none
            try:
                return batch_logps(base, inputs, prefix)[0]
            finally:
                base.train(was_training)


def batch_logps(model: Any, inputs: dict[str, Any], prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's summed answer log-probability and answer length, from one forward pass over a
    batch of PreferenceCollator (`prefix` "kl_": its KL rows), padded or packed."""
    ids, labels = inputs[f"{prefix}input_ids"], inputs[f"{prefix}labels"]
    if f"{prefix}position_ids" not in inputs:
        logits = model(input_ids=ids, attention_mask=inputs[f"{prefix}attention_mask"]).logits
        return sequence_logps(logits, labels)
    # Packed: positions restarting per sequence and no attention mask, from which the model builds the
    # block-diagonal mask; no cache (a model in eval mode makes one by default, and with a cache the
    # packed mask is not built: supertune.modeling.packed_attention).
    logits = model(input_ids=ids, position_ids=inputs[f"{prefix}position_ids"], use_cache=False).logits
    return sequence_logps(logits, labels, inputs[f"{prefix}sequence_ids"], sequence_count(inputs, prefix))


class MetricSums:
    """Each metric's sum over the rows it is a mean of, and their count, in one tensor on the device
    (no sync per batch): the averages are over every pair (row) added, whatever the batches were."""

    def __init__(self, device: Any) -> None:
        self.sums = torch.zeros(2, len(METRIC_NAMES), dtype=torch.float64, device=device)

    def add(self, out: LossOutput) -> None:
        for name, value in out.metrics.items():
            i = METRIC_NAMES.index(name)
            rows = torch.as_tensor(out.counts.get(name, out.rows), dtype=torch.float64, device=self.sums.device)
            self.sums[0, i] += value.detach().to(self.sums.device, torch.float64) * rows
            self.sums[1, i] += rows

    def averaged(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Each metric that was given, its mean; `reduce` sums the tensor over the processes first."""
        sums = self.sums if reduce is None else reduce(self.sums)
        values = (sums[0] / sums[1].clamp(min=1)).tolist()
        counts = sums[1].tolist()
        averaged = {name: v for name, v, n in zip(METRIC_NAMES, values, counts) if n > 0}
        # The margin is the chosen rewards' mean less the rejected ones', over every row added: for pairs
        # the mean of each pair's margin; for KTO, whose two means are over different rows, a mean of
        # each batch's difference would weigh the batches (and the processes) by their rows, not their labels.
        if "rewards/chosen" in averaged and "rewards/rejected" in averaged:
            averaged["rewards/margins"] = averaged["rewards/chosen"] - averaged["rewards/rejected"]
        return averaged


def _float32(out: LossOutput) -> LossOutput:
    """The loss the Trainer steps with in float32, as a model's own loss is (it is computed in float64)."""
    out.loss = out.loss.float()
    return out
