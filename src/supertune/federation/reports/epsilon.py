"""The privacy a federation has spent: epsilon at privacy.delta after each round, from Opacus's RDP
accountant, recomputed from the rounds' receipts whenever it is asked (nothing else is kept).

Each averaged round is one Gaussian mechanism on the sum of the sites' clipped changes: sensitivity
clip_norm (one site's data added or removed moves the sum by at most that), noise of standard
deviation sqrt(sum of the averaged sites' noise_std^2), as averaged.json records them from the packages
(rounds/phases.py). Its noise multiplier is that over clip_norm: the federation's noise_multiplier when
every site of the round was averaged, less when some were left out (their noise is missing from the
sum). Every site takes part in every round, so the sampling rate is 1; a site that sits rounds out
spends no more than this. The rounds compose (RDP adds up over rounds) and convert to (epsilon, delta)
as Opacus converts them.
"""

from __future__ import annotations

import math
import warnings

from ...errors import UserError
from ..config.privacy import OPACUS_PIN
from ..config.schema import FederationConfig
from ..state.layout import FederationDir
from ..state.receipts import read_receipt

__all__ = ["round_noise_multipliers", "epsilon_after", "round_epsilons", "privacy_summary", "ALPHAS"]

ALPHAS: list[float] = (
    [1 + x / 10.0 for x in range(1, 100)]
    + [float(a) for a in range(12, 64)]
    + [float(a) for a in (64, 80, 96, 128, 192, 256, 384, 512, 1024)]
)
"""RDP orders searched for the best conversion: Opacus's defaults, and larger ones, which few rounds of
much noise need."""


def round_noise_multipliers(fed: FederationConfig, root: FederationDir) -> dict[int, float]:
    """Each averaged round's noise multiplier (the sum's noise std / clip_norm), in round order, up to
    the first round not averaged yet."""
    found = {}
    for number in range(1, fed.rounds + 1):
        averaged = read_receipt(root.round(number).averaged)
        if averaged is None:
            break
        record = averaged.get("privacy") or {}
        clip = float(record.get("clip_norm") or 0.0)
        noise = record.get("noise_std") or {}
        total = math.sqrt(sum(float(v) ** 2 for v in noise.values())) if isinstance(noise, dict) else 0.0
        found[number] = total / clip if clip > 0 else 0.0
    return found


def epsilon_after(multipliers: list[float], delta: float) -> float:
    """Epsilon at `delta` of the rounds with these noise multipliers, composed (sampling rate 1);
    infinity when a round had no noise."""
    if not multipliers:
        return 0.0
    if min(multipliers) <= 0:
        return math.inf
    try:
        from opacus.accountants import RDPAccountant
    except ImportError:
        raise UserError(
            f"privacy: the epsilon accountant needs Opacus, which is not installed here: pip install '{OPACUS_PIN}' "
            "(or supertune[privacy])"
        ) from None
    accountant = RDPAccountant()
    for z in multipliers:
        accountant.step(noise_multiplier=z, sample_rate=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the optimal order is the largest alpha": the bound is still sound
        return float(accountant.get_epsilon(delta=delta, alphas=ALPHAS))


def round_epsilons(fed: FederationConfig, root: FederationDir) -> dict[int, float]:
    """Epsilon spent through each averaged round (empty without privacy)."""
    if not fed.privacy.active:
        return {}
    by_round = round_noise_multipliers(fed, root)
    rounds = list(by_round)
    return {n: epsilon_after([by_round[r] for r in rounds[: i + 1]], fed.privacy.delta) for i, n in enumerate(rounds)}


def privacy_summary(fed: FederationConfig, root: FederationDir) -> str:
    """One line: the epsilon spent so far, or '' without privacy."""
    pr = fed.privacy
    if not pr.active:
        return ""
    spent = round_epsilons(fed, root)
    settings = f"clip_norm {pr.clip_norm:g}, noise_multiplier {pr.noise_multiplier:g}"
    if not spent:
        return f"privacy: no round averaged yet ({settings})"
    last = max(spent)
    return (
        f"privacy: epsilon {_epsilon_text(spent[last])} at delta {pr.delta:g} spent through round {last} "
        f"({settings}; Opacus RDP accountant, sampling rate 1)"
    )


def _epsilon_text(value: float) -> str:
    return "inf (no noise)" if math.isinf(value) else f"{value:.3f}"
