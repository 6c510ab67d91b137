"""The checks of `mode: buffered` (docs/federated/buffered.md): its own settings, and every setting it does
not carry out yet, refused in one line naming the field, before anything is written. A synchronous
federation that sets a buffered-only key is told so, as an unused key is elsewhere."""

from __future__ import annotations

from .schema import AggregationConfig, FederationConfig, StalenessConfig
from .staleness import staleness_problems

__all__ = ["buffered_problems", "BUFFERED_ONLY"]

BUFFERED_ONLY = ("aggregation.buffer_size", "aggregation.staleness", "aggregation.max_staleness")
"""Keys read only in mode: buffered."""

_NOT_YET = "not supported with mode: buffered yet"


def buffered_problems(fed: FederationConfig) -> list[str]:
    """Everything wrong with the federation's buffered settings, one line each."""
    a = fed.aggregation
    if fed.mode != "buffered":
        default = AggregationConfig()
        set_here = [
            key
            for key, used in zip(
                BUFFERED_ONLY,
                (a.buffer_size != default.buffer_size, a.staleness != StalenessConfig(), a.max_staleness is not None),
            )
            if used
        ]
        return [f"{key}: only used with mode: buffered; remove it or set mode: buffered" for key in set_here]
    p: list[str] = []
    if a.buffer_size < 1:
        p.append(f"aggregation.buffer_size: must be at least 1 (changes per global version), got {a.buffer_size}")
    if a.max_staleness is not None and a.max_staleness < 0:
        p.append(f"aggregation.max_staleness: must be 0 or more (or empty: none dropped), got {a.max_staleness}")
    p += staleness_problems(a.staleness.kind, a.staleness.a, a.staleness.b)
    p += _unsupported(fed)
    return p


def _unsupported(fed: FederationConfig) -> list[str]:
    """What buffered rounds do not do yet: one line per field, each with the way on."""
    p: list[str] = []
    if fed.executor != "builtin":
        p.append(
            f"executor: {fed.executor} is {_NOT_YET} (local sites of executor: builtin only); use mode: synchronous"
        )
    for i, site in enumerate(fed.sites):
        where = f"sites[{i}]" + (f" ({site.name})" if site.name else "")
        if site.where != "local":
            p.append(
                f"{where}.where: {site.where} (a SLURM site) is {_NOT_YET}; use where: local, or mode: synchronous"
            )
        if site.from_round != 1 or site.until_round is not None:
            p.append(f"{where}.from_round/until_round: {_NOT_YET} (every site trains throughout); leave them out")
    refused = {
        "aggregation.min_sites": fed.aggregation.min_sites is not None,
        "round_deadline": bool(fed.round_deadline),
        "transfer": fed.transfer.active,
        "benchmarks": bool(fed.benchmarks),
        "optimizer_state": fed.optimizer_state != "fresh",
    }
    p += [f"{key}: {_NOT_YET}; leave it out, or use mode: synchronous" for key, used in refused.items() if used]
    return p
