"""The checks of `privacy:` (docs/federated/privacy.md): its own numbers, and every setting it does not
compose with yet, refused in one line naming the field, before anything is written.

What the guarantee rests on decides what is refused. The sum of the round's clipped changes moves by at
most clip_norm when one site's data is added or removed, and carries noise of standard deviation
noise_multiplier x clip_norm: both hold for the average only when every site counts the same
(aggregation.weights: uniform). A token-weighted average lets one site's change count more than 1/n of
the sum, so its sensitivity is no longer clip_norm / n and the noise promised is not enough.
"""

from __future__ import annotations

import importlib.util
import math

from .schema import FederationConfig

__all__ = ["privacy_problems", "privacy_install_problem", "site_noise_std", "OPACUS_PIN"]

OPACUS_PIN = "opacus==1.6.0"
"""The accountant's library, as pinned-requirements.txt pins it (pyproject.toml's extra `privacy`)."""


def privacy_problems(fed: FederationConfig) -> list[str]:
    """Everything wrong with the federation's privacy settings, one line each."""
    pr, p = fed.privacy, []
    if not math.isfinite(pr.noise_multiplier) or pr.noise_multiplier < 0:
        p.append(f"privacy.noise_multiplier: must be 0 or more (1 is usual), got {pr.noise_multiplier}")
    if pr.clip_norm is None and pr.noise_multiplier:
        p.append(
            "privacy.clip_norm: noise_multiplier needs the norm each site's change is clipped to; give a positive number"
        )
    if pr.clip_norm is not None and not (math.isfinite(pr.clip_norm) and pr.clip_norm > 0):
        p.append(f"privacy.clip_norm: must be a positive number (the L2 norm of a site's change), got {pr.clip_norm}")
    if not (math.isfinite(pr.delta) and 0 < pr.delta < 1):
        p.append(f"privacy.delta: must be in (0, 1) (1e-5 is usual), got {pr.delta}")
    if pr.active:
        p += _not_composed(fed)
    return p


def _not_composed(fed: FederationConfig) -> list[str]:
    """What privacy does not compose with yet: one line per field, each with the way on."""
    p = []
    if not fed.transfer.delta:
        p.append("privacy: clips and noises each site's change, which is sent only with transfer.delta: true; set it")
    if fed.aggregation.weights != "uniform" or any(s.weight is not None for s in fed.sites):
        p.append(
            "privacy: the noise covers one site's change only when every site counts the same; "
            "set aggregation.weights: uniform and leave sites[].weight out"
        )
    if fed.mode != "synchronous":
        p.append(f"privacy: not supported with mode: {fed.mode} yet; use mode: synchronous")
    return p


def privacy_install_problem(fed: FederationConfig) -> list[str]:
    """The accountant's library missing on this machine, in one line with what to install."""
    if not fed.privacy.active or importlib.util.find_spec("opacus") is not None:
        return []
    return [
        f"privacy: the epsilon accountant needs Opacus, which is not installed here: pip install '{OPACUS_PIN}' "
        "(or supertune[privacy])"
    ]


def site_noise_std(fed: FederationConfig, number: int) -> float:
    """The standard deviation of the noise each site of round `number` adds to every value of its clipped
    change: z C / sqrt(n), n the sites the federation (as given) has train in that round, so that the
    sum of their changes carries z C."""
    pr = fed.privacy
    n = max(1, sum(s.in_round(number) for s in fed.sites))
    return pr.noise_multiplier * float(pr.clip_norm or 0.0) / math.sqrt(n)
