"""What a site's round cost: every attempt of its training, finished, failed or cancelled at the
deadline, in `round-NNN/<site>/cost.json`, with the nodes it held (a local site: its processes) and when
it was submitted, started and ended. Node-hours are nodes x (end - start) summed over the attempts;
queue wait is start - submit.

A SLURM site's times are Slurm's own (scontrol's SubmitTime, StartTime and EndTime of the job, NumNodes).
A local site has no nodes of its own to count: its node-hours are its processes (launch.nproc: one
training worker, or torchrun's workers) x the wall time from their start to their end, with no queue;
an attempt recorded before the processes were kept counts as one. A failed or late attempt costs its
node-hours too: the grant paid for them.

A StreamFlow step on this machine records its own attempt: opened (outcome `running`, no end) when its
training starts, closed when it ends; one that was ended from outside (the round's `streamflow run`
failed or passed its deadline) is closed by the executor afterwards (`end_running_attempts`).
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

from .receipts import read_attempts, write_attempts
from .records import RUNNING, Attempt

__all__ = ["Attempt", "record_attempt", "site_cost", "slurm_attempt", "end_attempt", "end_running_attempts", "RUNNING"]


def record_attempt(path: Path, attempt: Attempt) -> None:
    """Add one attempt to the receipt."""
    attempts = read_attempts(path) or []
    if attempt.job is not None and any(a.job == attempt.job for a in attempts):
        return  # a resumed federation that waited for the same job again
    write_attempts(path, [*attempts, attempt])


def end_attempt(path: Path, start: float, end: float, outcome: str) -> None:
    """Close the running attempt that started at `start` (a StreamFlow step's own, recorded by record_attempt)."""
    attempts = [
        dataclasses.replace(a, end=end, outcome=outcome) if a.outcome == RUNNING and a.start == start else a
        for a in read_attempts(path) or []
    ]
    write_attempts(path, attempts)


def end_running_attempts(path: Path, end: float, outcome: str) -> list[Attempt]:
    """Close every attempt still running (its processes were ended from outside: they cannot close it);
    returns those closed."""
    attempts = read_attempts(path)
    if attempts is None:
        return []
    closed = [a for a in attempts if a.outcome == RUNNING]
    if closed:
        ended = [
            dataclasses.replace(a, end=max(end, a.start or end), outcome=outcome) if a.outcome == RUNNING else a
            for a in attempts
        ]
        write_attempts(path, ended)
    return closed


def site_cost(path: Path) -> dict[str, float | int | None]:
    """{node_hours, queue_s, attempts} of a site's round; None values when nothing was recorded."""
    attempts = read_attempts(path)
    if attempts is None:
        return {"node_hours": None, "queue_s": None, "attempts": None}
    node_seconds = queue = 0.0
    for a in attempts:
        start, end, submit = a.start, a.end, a.submit
        if _number(start) and _number(end):
            held = a.processes or a.nodes or 1  # a local attempt: its processes; SLURM: its nodes
            node_seconds += float(held) * max(0.0, end - start)
        if _number(start) and _number(submit):
            queue += max(0.0, start - submit)
        elif _number(submit) and _number(end):  # cancelled in the queue: it waited until it was cancelled
            queue += max(0.0, end - submit)
    return {"node_hours": node_seconds / 3600.0, "queue_s": queue, "attempts": len(attempts)}


def slurm_attempt(job_id: str, state, outcome: str, cancelled: bool = False) -> Attempt:
    """An attempt from what scontrol says of the job (a supertune.slurm.commands.JobState); `cancelled`:
    the job is being cancelled now, so it ends now (scontrol's EndTime of a running job is its time
    limit, and a pending job's StartTime is only the scheduler's guess)."""
    import time

    started = state.state not in ("PENDING", "CONFIGURING", "REQUEUED") or not cancelled
    return Attempt(
        job=job_id,
        nodes=state.num_nodes or 1,
        submit=_slurm_time(state.submit_time),
        start=_slurm_time(state.start_time) if started else None,
        end=float(int(time.time())) if cancelled else _slurm_time(state.end_time),
        outcome=outcome,
    )


def _slurm_time(text: str) -> float | None:
    """scontrol's times are the controller's local time without a zone (2026-11-26T10:00:00); Unknown
    or None before the event. Read in this machine's zone, which a login node shares with its cluster."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
