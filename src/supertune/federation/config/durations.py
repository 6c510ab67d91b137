"""A round's deadline as the config writes it (`round_deadline`: 2h, 90m, 1h30m, seconds), checked,
read as seconds, and said back as the round table and the reasons say a duration."""

from __future__ import annotations

import re

__all__ = ["deadline_problem", "deadline_seconds", "duration_text"]

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
    """2h, 1h30m, 3m27s, 90s: how the round table and messages say a duration (to the minute from an
    hour up, to the second below, so that a reason never says a shorter deadline than the one set)."""
    whole = int(round(seconds))
    if whole < 120:
        return f"{whole}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
