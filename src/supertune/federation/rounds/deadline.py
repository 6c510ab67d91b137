"""A round's deadline (`round_deadline`, read by config/durations.py): wall clock from the round's start,
queue time included.

The start is a receipt, `round-NNN/started.json`, written when the round's training first starts:
a federation killed and resumed keeps the deadline it had (the sites' SLURM jobs kept their places in
the queue meanwhile, and the time counts), so that it decides about the same sites. A round that
stopped at its deadline below its quorum forgets its start (`forget_start`): the next run of
`supertune federate DIR` gives the round a full deadline again, rather than finding it passed at once.
"""

from __future__ import annotations

import time

from ..state.layout import RoundDir
from ..state.receipts import read_receipt, write_receipt

__all__ = ["round_start", "round_until", "forget_start"]


def round_start(rd: RoundDir, seconds: float | None) -> dict:
    """The round's start receipt {round, unix, deadline_s}, recorded now if it has none."""
    started = read_receipt(rd.started)
    if started is None or not isinstance(started.get("unix"), (int, float)):
        started = {"round": rd.number, "unix": time.time(), "deadline_s": seconds}
        write_receipt(rd.started, started)
    return started


def round_until(rd: RoundDir, seconds: float | None) -> float | None:
    """The unix time at which the round's deadline passes (its start recorded now if it has none), or
    None without a deadline."""
    if seconds is None:
        return None
    return float(round_start(rd, seconds)["unix"]) + seconds


def forget_start(rd: RoundDir) -> None:
    """The round stopped below its quorum at its deadline: its next run starts a new deadline."""
    rd.started.unlink(missing_ok=True)
