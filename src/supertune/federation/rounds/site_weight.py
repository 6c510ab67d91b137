"""What one site's change counts in a round's average before it is normalised: the site's fixed
`sites[].weight`, else `aggregation.weights` (1 for uniform, its tokens or samples otherwise).

The one rule for the rounds that weigh changes one at a time (buffered arrivals, the secure sum's weight
fractions); the synchronous average hands the same choice to averaging.weights.input_weights.
"""

from __future__ import annotations

from ..config.schema import FederationConfig

__all__ = ["site_count"]


def site_count(fed: FederationConfig, site: str, tokens: object, samples: object) -> float | None:
    """The site's unnormalised weight; None when aggregation.weights asks for a count it does not have
    (missing, not a number, or negative): the caller names where it looked."""
    fixed = {s.name: s.weight for s in fed.sites}.get(site)
    if fixed is not None:
        return float(fixed)
    mode = fed.aggregation.weights
    if mode == "uniform":
        return 1.0
    count = tokens if mode == "tokens" else samples
    if not isinstance(count, (int, float)) or isinstance(count, bool) or count < 0:
        return None
    return float(count)
