"""The preference losses, one function per objective of supertune.config.objectives.OBJECTIVES.

Each takes the summed log-probabilities of the answers' tokens (the policy's, and the reference's
where the objective has one) and returns the batch's loss, the mean over its pairs (or rows), with
the metrics under TRL's names: rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies, logps/chosen, logps/rejected. A reward is what the objective prefers by:
beta x the log-probability ratio to the reference (DPO, KTO), beta x the mean token log-probability
(ORPO and SimPO, which have no reference).

The log-probabilities and the losses are computed in float64 (see sequence_logps); the loss the
Trainer steps with is cast to float32. Where the papers and TRL differ, the papers are followed and the docs say so (docs/preference.md):
IPO's margin is over summed log-probabilities (TRL averages them per token), and ORPO's
cross-entropy is each chosen answer's token mean, averaged over the pairs (TRL's is over all
chosen tokens of the batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ...config.schema import TrainingConfig
from ..data.loss_tokens import IGNORED_LABEL

__all__ = [
    "DPO_LOSSES",
    "LOSSES",
    "LossOutput",
    "PairLogps",
    "UnpairedLogps",
    "sequence_logps",
]


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, sequence_ids: torch.Tensor | None = None, sequences: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each sequence's labelled tokens, their count): token t+1 scored from
    position t, labels of -100 skipped. A sequence is a row of the batch, or in a packed batch
    (supertune.training_data.preference_batches) the tokens `sequence_ids` names, `sequences` of them
    (a sequence's first token has label -100 there, so no target is scored across two sequences).

    In float64, from the logits of the labelled positions alone: a sum of a hundred token
    log-probabilities of about -7 each is a number float32 holds to 8e-6 only, which the IPO loss
    (a square of differences of such sums) would carry into the loss. Only the answers' rows of logits
    are copied, a small part of the batch's logits when the prompts are long.
    """
    targets = labels[:, 1:]
    kept = targets != IGNORED_LABEL
    rows, positions = kept.nonzero(as_tuple=True)
    scored = logits[:, :-1][rows, positions].double()
    token_logps = scored.gather(-1, targets[rows, positions].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scored, -1)
    if sequence_ids is None:
        sums = torch.zeros(logits.shape[0], dtype=torch.float64, device=logits.device).index_add(0, rows, token_logps)
        return sums, kept.sum(-1)
    owner = sequence_ids[:, 1:][rows, positions]
    sums = torch.zeros(sequences, dtype=torch.float64, device=logits.device).index_add(0, owner, token_logps)
    counts = torch.zeros(sequences, dtype=torch.long, device=logits.device).index_add(0, owner, torch.ones_like(owner))
    return sums, counts


@dataclass
class PairLogps:
    """Per pair: the policy's summed answer log-probabilities and answer lengths; the reference's or None."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None


@dataclass
class UnpairedLogps:
    """Per row (KTO): the answer's summed log-probability, the reference's, whether it is desirable,
    and the batch's KL estimate (detached, never negative)."""

    answer: torch.Tensor
    ref_answer: torch.Tensor
    desirable: torch.Tensor
    kl: torch.Tensor


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    """Means over the batch's pairs (rows), or over the rows `counts` says."""
    rows: int = 0
    """Pairs (rows) in the batch: the weight of its means when batches are averaged."""
    counts: dict[str, torch.Tensor] = field(default_factory=dict)
    """The rows a metric is a mean over, where not all of them (KTO's desirable and undesirable rows)."""


def _pair_metrics(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, lp: PairLogps
) -> dict[str, torch.Tensor]:
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "logps/chosen": lp.chosen.detach().mean(),
        "logps/rejected": lp.rejected.detach().mean(),
    }


def _sigmoid(margin: torch.Tensor, beta: float) -> torch.Tensor:
    return -F.logsigmoid(beta * margin)


def _ipo(margin: torch.Tensor, beta: float) -> torch.Tensor:
    return (margin - 1 / (2 * beta)) ** 2


def _hinge(margin: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.relu(1 - beta * margin)


DPO_LOSSES: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "sigmoid": _sigmoid,
    "ipo": _ipo,
    "hinge": _hinge,
}
"""training.dpo_loss: each pair's loss from its margin (the chosen answer's log-ratio to the
reference less the rejected one's) and beta."""


def _reference(lp: PairLogps) -> tuple[torch.Tensor, torch.Tensor]:
    if lp.ref_chosen is None or lp.ref_rejected is None:
        raise ValueError("this objective needs the reference model's log-probabilities, and the batch has none")
    return lp.ref_chosen, lp.ref_rejected


def dpo(lp: PairLogps, t: TrainingConfig) -> LossOutput:
    ref_chosen, ref_rejected = _reference(lp)
    chosen_ratio, rejected_ratio = lp.chosen - ref_chosen, lp.rejected - ref_rejected
    losses = DPO_LOSSES[t.dpo_loss](chosen_ratio - rejected_ratio, t.beta)
    return LossOutput(losses.mean(), _pair_metrics(t.beta * chosen_ratio, t.beta * rejected_ratio, lp), len(losses))


def orpo(lp: PairLogps, t: TrainingConfig) -> LossOutput:
    chosen_mean = lp.chosen / lp.chosen_tokens
    rejected_mean = lp.rejected / lp.rejected_tokens
    # log odds(y) = log p - log(1 - p) with log p the mean token log-probability; log1p(-exp(.)) keeps
    # it exact for p near 0 and finite below 1.
    log_odds = (chosen_mean - rejected_mean) - (
        torch.log1p(-torch.exp(chosen_mean)) - torch.log1p(-torch.exp(rejected_mean))
    )
    ratio_loss = -F.logsigmoid(log_odds)
    nll = -chosen_mean
    metrics = _pair_metrics(t.beta * chosen_mean, t.beta * rejected_mean, lp)
    metrics["nll_loss"] = nll.detach().mean()
    metrics["log_odds_ratio"] = log_odds.detach().mean()
    return LossOutput((nll + t.beta * ratio_loss).mean(), metrics, len(nll))


def simpo(lp: PairLogps, t: TrainingConfig) -> LossOutput:
    chosen_rewards = t.beta * lp.chosen / lp.chosen_tokens
    rejected_rewards = t.beta * lp.rejected / lp.rejected_tokens
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards - t.simpo_gamma)
    return LossOutput(losses.mean(), _pair_metrics(chosen_rewards, rejected_rewards, lp), len(losses))


def kto(lp: UnpairedLogps, t: TrainingConfig) -> LossOutput:
    ratio = lp.answer - lp.ref_answer
    good = lp.desirable
    losses = torch.where(
        good,
        t.desirable_weight * (1 - torch.sigmoid(t.beta * (ratio - lp.kl))),
        t.undesirable_weight * (1 - torch.sigmoid(t.beta * (lp.kl - ratio))),
    )
    rewards = (t.beta * ratio).detach()
    metrics: dict[str, torch.Tensor] = {"kl": lp.kl.detach()}
    counts: dict[str, torch.Tensor] = {}
    for side, rows in (("chosen", good), ("rejected", ~good)):
        if rows.any():
            metrics[f"rewards/{side}"] = rewards[rows].mean()
            metrics[f"logps/{side}"] = lp.answer.detach()[rows].mean()
            counts[f"rewards/{side}"] = counts[f"logps/{side}"] = rows.sum()
    if good.any() and (~good).any():
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return LossOutput(losses.mean(), metrics, len(losses), counts)


LOSSES: dict[str, Callable[[Any, TrainingConfig], LossOutput]] = {
    "dpo": dpo,
    "orpo": orpo,
    "simpo": simpo,
    "kto": kto,
}
"""The loss of each preference objective (every name of OBJECTIVES but sft)."""
