"""The words and times of the attempt rules every executor shares (attempt_policy.py applies them):
when a round's deadline passes, and how a failed or late site's reason is said. Each attempt's cost is
a state.records.Attempt.

A reason is what the round table shows of a failure: its first line, without the site's label the
message starts with, cut at REASON_CHARS characters.
"""

from __future__ import annotations

from ..config.durations import deadline_seconds
from ..config.schema import FederationConfig
from ..state.layout import RoundDir
from .deadline import round_until
from .failures import deadline_text
from .loop import RoundWork

__all__ = ["REASON_CHARS", "cut_reason", "reason_of", "round_deadline", "not_started"]

REASON_CHARS = 300
"""The longest reason kept: a table cell and a log line, not a log."""


def cut_reason(text: str) -> str:
    """A reason as it is kept: at most REASON_CHARS characters."""
    return text[:REASON_CHARS]


def reason_of(error: BaseException | str, label: str | None = None) -> str:
    """The reason a failure's message gives: its first line, without the `label: ` it starts with, cut."""
    text = str(error)
    if label is not None:
        text = text.removeprefix(f"{label}: ")
    return cut_reason(text.splitlines()[0] if text else text)


def round_deadline(fed: FederationConfig, work: RoundWork) -> float | None:
    """The unix time at which this round's deadline passes (its start recorded now if it has none), or
    None without round_deadline."""
    return round_until(RoundDir(work.averaged.parent, work.number), deadline_seconds(fed.round_deadline))


def not_started(fed: FederationConfig, why: str = "") -> str:
    """The reason of a site whose deadline passed before its attempt started (a round resumed late, or
    the sites on this machine training one after another)."""
    return f"late: not started after {deadline_text(fed)}{why}"
