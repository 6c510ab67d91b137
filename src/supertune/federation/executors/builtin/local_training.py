"""The built-in executor's attempts of a local site's training (`where: local`): its processes on this
machine, one site after another (they share this machine's cores), each attempt resuming the site's
run from its latest checkpoint and ended at the round's deadline. The attempt policy
(rounds/attempt_policy.py) decides what follows an attempt, and writes each attempt's processes and
wall time (its Ending's cost) to the site's cost.json."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ....errors import UserError
from ...config.schema import FederationConfig
from ...rounds.attempt_policy import Ending
from ...rounds.attempts import not_started, reason_of
from ...rounds.failures import FederationError, SiteLate, deadline_text
from ...rounds.log_tail import log_tail
from ...rounds.loop import SiteWork
from ...rounds.phases import record_finished_training
from ...state.records import Attempt

__all__ = ["LocalTraining"]

log = logging.getLogger("supertune")


class LocalTraining:
    """An AttemptRunner whose every attempt runs to its end in `start`: nothing is left to wait for."""

    batch = False

    def __init__(self, fed: FederationConfig, until: float | None) -> None:
        self.fed, self.until = fed, until

    def start(self, w: SiteWork, tries: int) -> Ending:
        if self.until is not None and time.time() >= self.until:
            local = sum(s.where == "local" for s in self.fed.sites)
            why = " (the sites on this machine train one after another)" if local > 1 else ""
            return Ending(not_started(self.fed, why), late=True, tried=False, note="left for the quorum")
        cost = None
        try:
            cost, error = self._train(w)
            if error is None:
                record_finished_training(w)
        except FederationError as exc:  # its config could not be resolved, or its checkpoint is refused
            error = exc
        if isinstance(error, SiteLate):
            return Ending(error.reason, str(error), late=True, note="its processes were ended", cost=cost)
        if error is not None:
            return Ending(error.reason or reason_of(error, w.label), str(error), cost=cost)
        return Ending(cost=cost)

    def ended(self, started: dict[str, None]) -> Iterator[tuple[str, Ending]]:
        return iter(())

    def cancel(self, w: SiteWork, handle: None, ending: Ending) -> Ending:
        # its processes were ended by train_logged, at the deadline it was given
        return Ending(ending.reason, ending.message, late=True, note="its processes were ended")

    def _train(self, w: SiteWork) -> tuple[Attempt, FederationError | None]:
        """Train the site here until its run finishes, fails or the deadline passes: the attempt's cost,
        and the error that says how it ended when it did not finish (SiteLate: at the deadline)."""
        from ....resolve import resolve
        from ....runs.local import train_logged

        assert w.run is not None
        logfile = w.directory / "train.log"
        log.info("%s: training here (log %s)", w.label, logfile)
        started = time.time()
        try:
            resolution = resolve(w.config, [])
            outcome = train_logged(resolution, w.run, logfile, until=self.until)
        except UserError as exc:
            raise FederationError(f"{w.label}: {exc}", reason=f"failed: {reason_of(exc)}") from None
        finally:
            ended = time.time()
        code = outcome.exit_code
        result = (
            f"late: running after {deadline_text(self.fed)}"
            if outcome.late
            else "finished"
            if code == 0
            else f"failed: killed by signal {-code}"
            if code < 0
            else f"failed: exit {code}"
        )
        nproc = resolution.config.launch.nproc
        cost = Attempt(job=None, nodes=1, submit=started, start=started, end=ended, outcome=result, processes=nproc)
        if outcome.late:
            return cost, SiteLate(f"{w.label}: {result}; its processes were ended", reason=result)
        if code != 0:
            return cost, FederationError(
                f"{w.label}: local training stopped (exit code {code}){log_tail(logfile)}; the run in {w.run} resumes "
                "from its latest checkpoint when the federation is run again",
                reason=result,
            )
        return cost, None
