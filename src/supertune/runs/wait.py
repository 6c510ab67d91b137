"""Waiting for SLURM jobs: the one poll loop. Slurm is asked about each job at most once per
`poll_seconds` (schedulers ask their users not to poll harder); a job that has ended is handed back
at once, so that the caller can act on it while the others still run."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TypeVar

from ..slurm.commands import JobState, job_state

__all__ = ["POLL_SECONDS", "wait_for_jobs"]

POLL_SECONDS = 5.0
"""How often a job is asked about when the caller has no setting of its own."""

K = TypeVar("K", bound=Hashable)


def wait_for_jobs(
    jobs: Mapping[K, str],
    poll_seconds: float = POLL_SECONDS,
    changed: Callable[[K, JobState], None] | None = None,
    until: float | None = None,
) -> Iterator[tuple[K, JobState]]:
    """Yield (key, final state) for each job of `jobs` (key -> job id) as it ends, until all have.
    `changed` hears each state a job is first seen in (PENDING, RUNNING, ... the final one included).
    With `until` (unix time): once it has passed, every job still going is yielded with its last state
    (not finished) and the waiting ends. Stopping the iteration stops the waiting (the jobs go on)."""
    pending = dict(jobs)
    seen: dict[K, str] = {}
    last: dict[K, JobState] = {}
    while pending:
        for key, job_id in list(pending.items()):
            state = last[key] = job_state(job_id)
            if changed is not None and seen.get(key) != state.state:
                seen[key] = state.state
                changed(key, state)
            if state.finished:
                del pending[key]
                yield key, state
        if pending and until is not None and time.time() >= until:
            for key in list(pending):
                del pending[key]
                yield key, last[key]
            return
        if pending:
            time.sleep(poll_seconds if until is None else max(0.0, min(poll_seconds, until - time.time())))
