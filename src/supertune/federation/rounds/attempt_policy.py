"""The attempt policy of a round's training, written once for every executor: a site's training is
tried again after a failure (`site_retries`) while the round's deadline allows, is not tried again once
it was late, and when it failed every attempt, or was late, it is left to the quorum (quorum.py), or,
with no quorum and no deadline to decide by, its failure stops the federation.

An executor supplies an `AttemptRunner`: how one attempt of a site is started, how it ended, and how
one unfinished at the deadline is cancelled; each `Ending` carries the attempt's cost as the executor
sees it (only it knows a job's times). The policy decides, writes the cost to the site's cost.json,
says it in the log, and keeps each failed site's reason and attempts (`failed`) for the quorum.
StreamFlow's steps write their own attempts where they run (a step ended from outside is closed by
the executor: streamflow/outcomes.py).

Two kinds of runner. One that attempts each site on its own (the built-in executor: local processes,
SLURM jobs) reports a failure that is tried again as `attempt 1 of 2 failed; trying again: <why>`, and
without a quorum or a deadline the site's failure is raised at once. A batch runner attempts all its
sites as one run (StreamFlow's workflow): every site's attempt is said as `attempt 1 of 2: <reason>`,
and every failure goes to the quorum, which stops the round when it cannot go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ...errors import UserError
from ..config.schema import FederationConfig
from ..state.cost import record_attempt
from ..state.records import Attempt
from .failures import FederationError
from .loop import RoundWork, SiteWork
from .quorum import leave_out_failed_sites

__all__ = [
    "Ending",
    "FINISHED",
    "AttemptRunner",
    "AttemptPolicy",
    "submit_with_retries",
    "attempts_allowed",
    "say_retry",
]

log = logging.getLogger("supertune")

Handle = TypeVar("Handle")
Submitted = TypeVar("Submitted")


@dataclass(frozen=True)
class Ending:
    """How one attempt of a site's training ended."""

    reason: str | None = None
    """None: finished (its receipt written); else the short reason the round table shows."""
    message: str = ""
    """The whole story (where its log is, how to go on): the log's, and the error's when it stops the federation."""
    late: bool = False
    """Ended at, or not started by, the round's deadline: not tried again."""
    tried: bool = True
    """False for an attempt that never started (the deadline had passed): it is not counted."""
    note: str = ""
    """What was done about a late attempt (`its processes were ended`), said after its reason."""
    pause: float = 0.0
    """Seconds to wait before trying again (a cluster that could not be reached)."""
    again: bool = True
    """False when another attempt cannot end otherwise (a finished run whose checkpoint is refused)."""
    cost: Attempt | None = None
    """The attempt's entry in the site's cost.json; None when it has none (it never started, or the
    executor's steps record their own)."""


FINISHED = Ending()


class AttemptRunner(Protocol[Handle]):
    """How an executor runs one attempt of a site's training."""

    batch: bool
    """True when its attempts of all sites are one run (see the module's docstring)."""

    def start(self, w: SiteWork, tries: int) -> Handle | Ending:
        """Start attempt `tries` of the site: a handle to wait for, or its Ending when it ended already
        (it ran here to its end, its run had finished, it could not be started)."""
        ...

    def ended(self, started: dict[str, Handle]) -> Iterator[tuple[str, Ending]]:
        """Each started attempt's Ending as it comes (site name, Ending); one still unfinished at the
        round's deadline comes late, to be cancelled."""
        ...

    def cancel(self, w: SiteWork, handle: Handle, ending: Ending) -> Ending:
        """Cancel a late attempt: its Ending with what was done (`note`, for the log) and its cost."""
        ...


def attempts_allowed(fed: FederationConfig) -> int:
    """Tries of a site's training (of a round, or a buffered task) and of its jobs' submissions: 1 + site_retries."""
    return 1 + fed.site_retries


def say_retry(label: str, tries: int, attempts: int, why: str, pause: float = 0.0) -> None:
    """The log line of a failed attempt that is tried again."""
    wait = f" in {pause:g}s" if pause else ""
    log.warning("%s: attempt %d of %d failed; trying again%s: %s", label, tries, attempts, wait, why)


class AttemptPolicy(Generic[Handle]):
    """The round's attempts of its sites' training: start them (`start`, `run`), wait for them
    (`wait`), then `leave_out` the sites in `failed` (site -> (reason, attempts))."""

    def __init__(self, fed: FederationConfig, work: RoundWork, until: float | None) -> None:
        self.fed, self.work = fed, work
        self.until = until
        """The unix time at which the round's deadline passes (attempts.round_deadline); None without one."""
        self.attempts = attempts_allowed(fed)
        self.failed: dict[str, tuple[str, int]] = {}
        self.tries: dict[str, int] = {}
        self._reasons: dict[str, str] = {}

    @property
    def decides(self) -> bool:
        """Whether a quorum or a deadline decides about failed sites, rather than the first failure."""
        return self.fed.aggregation.min_sites is not None or self.until is not None

    def allows_another(self, tries: int, pause: float = 0.0) -> bool:
        """Whether a site that failed attempt `tries` is tried again: retries left, and the deadline not
        passed (after `pause`)."""
        return tries < self.attempts and (self.until is None or time.time() + pause < self.until)

    def fail(self, w: SiteWork, reason: str, tries: int) -> None:
        """The site failed every attempt, or was late: the quorum decides (leave_out)."""
        self.failed[w.name] = (reason, tries)

    def run(self, works: list[SiteWork], runner: AttemptRunner[Handle]) -> None:
        """Every attempt of each site in `works`, until each finished or failed for good."""
        self.wait(self.start(works, runner), runner)

    def start(self, works: list[SiteWork], runner: AttemptRunner[Handle]) -> dict[str, Handle]:
        """Start each site's next attempt (again at once after one that failed to start, while the
        policy allows); returns the handles of those started."""
        started = {}
        for w in works:
            handle = self._start(w, runner)
            if handle is not None:
                started[w.name] = handle
        return started

    def wait(self, started: dict[str, Handle], runner: AttemptRunner[Handle]) -> None:
        """Until every started attempt ended: a failed one is started again while the policy allows, a
        late one is cancelled."""
        named = {w.name: w for w in self.work.train}
        while started:
            again: dict[str, Handle] = {}
            for name, ending in runner.ended(started):
                w = named[name]
                if ending.late and ending.reason is not None:
                    ending = runner.cancel(w, started[name], ending)
                if not self._settled(w, ending, runner):
                    handle = self._start(w, runner)
                    if handle is not None:
                        again[name] = handle
            started = again

    def leave_out(self) -> None:
        """Leave the failed sites out of the round when the quorum allows, naming the round's deadline when
        there is one; else UserError (quorum.py)."""
        if self.failed:
            deadline = self.fed.round_deadline if self.until else None
            leave_out_failed_sites(self.fed, self.work, self.failed, deadline=deadline)

    def _start(self, w: SiteWork, runner: AttemptRunner[Handle]) -> Handle | None:
        while True:
            tries = self.tries[w.name] = self.tries.get(w.name, 0) + 1
            got = runner.start(w, tries)
            if not isinstance(got, Ending):
                return got
            if not got.tried:
                self.tries[w.name] = tries - 1
            if self._settled(w, got, runner):
                return None

    def _settled(self, w: SiteWork, ending: Ending, runner: AttemptRunner[Handle]) -> bool:
        """Decide after an attempt's Ending: True when the site is done (finished, or failed for good:
        in `failed`, or raised), False when it is to be tried again (after the ending's pause)."""
        if ending.cost is not None:
            record_attempt(w.directory / "cost.json", ending.cost)
        if ending.reason is None:
            self._reasons.pop(w.name, None)
            return True
        tries = self.tries[w.name]
        if not ending.tried:  # not started by the deadline: an earlier attempt's failure is the reason
            reason = self._reasons.get(w.name)
            if reason is None and ending.note:
                log.warning("%s: %s; %s", w.label, ending.reason, ending.note)
            self.fail(w, reason or ending.reason, tries)
            return True
        self._reasons[w.name] = ending.reason
        again = ending.again and not ending.late and self.allows_another(tries, ending.pause)
        if runner.batch:
            log.warning("%s: attempt %d of %d: %s%s", w.label, tries, self.attempts, ending.reason,
                        "; trying again" if again else "")  # fmt: skip
        elif ending.late:
            log.warning("%s: %s; %s", w.label, ending.reason, ending.note)
        elif again:
            say_retry(w.label, tries, self.attempts, ending.message or ending.reason, ending.pause)
        elif not self.decides:
            raise FederationError(ending.message or ending.reason, reason=ending.reason)
        else:
            log.warning(
                "%s: attempt %d of %d failed: %s", w.label, tries, self.attempts, ending.message or ending.reason
            )
        if again:
            time.sleep(ending.pause)
            return False
        self.fail(w, ending.reason, tries)
        return True


def submit_with_retries(fed: FederationConfig, label: str, what: str, submit: Callable[[], Submitted]) -> Submitted:
    """`submit()` (a site's job handed to its scheduler, other than its training's attempts), tried again
    `poll_seconds` later after a UserError (the cluster unreachable, sbatch refusing it), at most
    1 + site_retries times in all, as a training's submission is: a blip of the network costs a pause,
    not the federation. FederationError naming the site, the job and the last error once none is left."""
    attempts, tries = attempts_allowed(fed), 0
    while True:
        tries += 1
        try:
            return submit()
        except UserError as exc:
            if tries >= attempts:
                raise FederationError(
                    f"{label}: submitting the {what} job failed {tries} time(s) (1 + site_retries): {exc}; "
                    "run the federation again to resubmit it",
                    reason=f"failed: submitting its {what} job",
                ) from None
            log.warning("%s: submitting the %s job failed (attempt %d of %d); trying again in %gs: %s", label, what,
                        tries, attempts, fed.poll_seconds, exc)  # fmt: skip
            time.sleep(fed.poll_seconds)
