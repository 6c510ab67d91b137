"""What one check found: a verdict, the evidence it rests on, and the fix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["Verdict", "CheckResult", "ok", "warn", "fail", "not_applicable", "worst", "SEVERITY"]

Verdict = Literal["ok", "n/a", "warn", "fail"]
"""ok: nothing to do; n/a: the check has nothing to look at on this node (no GPU, no job, ...);
warn: works, but slower or riskier than it should; fail: the run would fail or hang."""

SEVERITY: dict[str, int] = {"ok": 0, "n/a": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check of `supertune doctor`."""

    name: str
    """Stable identifier (e.g. "nccl-socket-ifname"), the key scripts match on in --json output."""
    verdict: Verdict
    evidence: str
    """What was looked at and what was found, with the values that decided the verdict."""
    fix: str = ""
    """What to do about it; empty when there is nothing to do."""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def ok(name: str, evidence: str) -> CheckResult:
    return CheckResult(name, "ok", evidence)


def warn(name: str, evidence: str, fix: str) -> CheckResult:
    return CheckResult(name, "warn", evidence, fix)


def fail(name: str, evidence: str, fix: str) -> CheckResult:
    return CheckResult(name, "fail", evidence, fix)


def not_applicable(name: str, why: str) -> CheckResult:
    return CheckResult(name, "n/a", f"not applicable here: {why}")


def worst(results: Iterable[CheckResult]) -> Verdict:
    """The most severe verdict of `results` ("ok" for none)."""
    found: Verdict = "ok"
    for result in results:
        if SEVERITY[result.verdict] > SEVERITY[found]:
            found = result.verdict
    return found
