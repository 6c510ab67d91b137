"""The staleness weight s(u) of buffered rounds (mode: buffered), one record per kind: its formula, the
parameters it reads and their checks. Every caller (the weight of an arrival, the config check, the
docs) asks this table; no formula is written anywhere else.

u is how many global versions the site's starting model is behind the version its change is applied
to (0: it started from the newest). An arrival's weight in the average is its tokens x s(u).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["StalenessKind", "STALENESS", "staleness_names", "staleness_weight", "staleness_problems"]


@dataclass(frozen=True)
class StalenessKind:
    """One kind of staleness weight."""

    name: str
    formula: str
    """The formula as the docs and --help show it."""
    weight: Callable[[int, float, float], float]
    """(u, a, b) -> s(u)."""
    reads: tuple[str, ...]
    """The parameters (a, b) the formula uses."""


def _polynomial(u: int, a: float, b: float) -> float:
    return float((u + 1) ** -a)


def _hinge(u: int, a: float, b: float) -> float:
    return 1.0 if u <= b else 1.0 / (a * (u - b) + 1.0)


STALENESS: dict[str, StalenessKind] = {
    k.name: k
    for k in (
        StalenessKind("constant", "s(u) = 1", lambda u, a, b: 1.0, ()),
        StalenessKind("polynomial", "s(u) = (u + 1)^-a", _polynomial, ("a",)),
        StalenessKind("hinge", "s(u) = 1 if u <= b, else 1 / (a (u - b) + 1)", _hinge, ("a", "b")),
    )
}


def staleness_names() -> list[str]:
    return list(STALENESS)


def staleness_weight(kind: str, a: float, b: float, u: int) -> float:
    """s(u) of `kind` with parameters a and b, for a change whose starting model is u versions behind."""
    if u < 0:
        raise ValueError(f"staleness {u}: a change cannot start from a version not yet published")
    return STALENESS[kind].weight(u, a, b)


def staleness_problems(kind: str, a: float, b: float, where: str = "aggregation.staleness") -> list[str]:
    """What is wrong with the parameters `kind` reads, one line each naming the field and the fix."""
    reads = STALENESS[kind].reads if kind in STALENESS else ()
    p = []
    if "a" in reads and not (math.isfinite(a) and a > 0):
        p.append(f"{where}.a: must be a positive number for kind: {kind} (0.5 is usual), got {a}")
    if "b" in reads and not (math.isfinite(b) and b >= 0):
        p.append(f"{where}.b: must be 0 or more for kind: hinge (versions of staleness weighted 1), got {b}")
    return p
