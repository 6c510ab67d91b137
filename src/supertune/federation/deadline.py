"""A round's deadline (`round_deadline`): wall clock from the round's start, queue time included.

The start is a receipt, `round-NNN/started.json`, written when the round's training first starts:
a federation killed and resumed keeps the deadline it had (the sites' SLURM jobs kept their places in
the queue meanwhile, and the time counts), so that it decides about the same sites. A round that
stopped at its deadline below its quorum forgets its start (`forget_start`): the next run of
`supertune federate DIR` gives the round a full deadline again, rather than finding it passed at once.
"""

from __future__ import annotations

import re
import time

from .layout import RoundDir
from .receipts import read_receipt, write_receipt

__all__ = ["deadline_problem", "deadline_seconds", "duration_text", "round_until", "forget_start"]

_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def deadline_seconds(text: str | None) -> float | None:
    """Seconds of a duration that passed `deadline_problem`: `2h`, `90m`, `1h30m`, `45s`, `1d`, or a
    number of seconds; None for none."""
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        return sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))


def deadline_problem(text: str | None) -> str | None:
    """None for a sound `round_deadline`, else the problem and its fix."""
    if text is None or not str(text).strip():
        return None
    value = str(text).strip()
    try:
        seconds = float(value)
    except ValueError:
        if _PART.sub("", value) or not _PART.search(value):
            return f"round_deadline: {value!r} is not a duration; write e.g. 2h, 90m, 1h30m or a number of seconds"
        seconds = deadline_seconds(value) or 0.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        return f"round_deadline: must be a positive duration (e.g. 2h), got {value!r}; leave it empty for none"
    return None


def duration_text(seconds: float) -> str:
    """2h, 1h30m, 90s: how the round table and messages say a duration."""
    whole = int(round(seconds))
    if whole < 120:
        return f"{whole}s"
    hours, rest = divmod(whole, 3600)
    minutes = rest // 60
    return f"{hours}h{minutes:02d}m" if hours and minutes else f"{hours}h" if hours else f"{minutes}m"


def round_until(rd: RoundDir, seconds: float | None) -> float | None:
    """The unix time at which the round's deadline passes (its start recorded now if it has none), or
    None without a deadline."""
    if seconds is None:
        return None
    started = read_receipt(rd.started)
    if started is None or not isinstance(started.get("unix"), (int, float)):
        started = {"round": rd.number, "unix": time.time(), "deadline_s": seconds}
        write_receipt(rd.started, started)
    return float(started["unix"]) + seconds


def forget_start(rd: RoundDir) -> None:
    """The round stopped below its quorum at its deadline: its next run starts a new deadline."""
    rd.started.unlink(missing_ok=True)
