"""The StreamFlow executor's attempts of a round's training, with a quorum, retries or a deadline: an
attempt is one workflow of train steps for every site not finished yet, whose steps report a failed
training instead of failing (StreamFlow would end the other sites' steps), ended at the round's
deadline (StreamFlow's processes as a group, its SLURM jobs cancelled by name). The attempt policy
(rounds/attempt_policy.py) decides which sites the next workflow trains; each step's attempt goes to
its site's cost.json (outcomes.record_costs)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

from ...config.schema import FederationConfig
from ...rounds.attempt_policy import FINISHED, Ending
from ...rounds.attempts import not_started
from ...rounds.failures import deadline_text
from ...rounds.loop import RoundWork, SiteWork
from .cwl import RoundFiles, SitePlace
from .outcomes import record_costs, training_outcomes
from .round_outputs import streamflow_errors

__all__ = ["StreamFlowTraining"]

log = logging.getLogger("supertune")

RunWorkflow = Callable[[RoundWork, float | None], tuple[int | None, int, float]]
"""One `streamflow run` of a round's training until the deadline: (exit code, None when ended at the
deadline; where this attempt starts in StreamFlow's log; when it ended)."""


class StreamFlowTraining:
    """An AttemptRunner whose attempts of all its sites are one workflow: `start` only names a site for
    the next one, `ended` runs it."""

    batch = True

    def __init__(
        self,
        fed: FederationConfig,
        work: RoundWork,
        places: dict[str, SitePlace],
        files: RoundFiles,
        until: float | None,
        run: RunWorkflow,
        cancel_jobs: Callable[[RoundWork], str],
    ) -> None:
        self.fed, self.work, self.places, self.files, self.until = fed, work, places, files, until
        self._run, self._cancel_jobs = run, cancel_jobs

    def start(self, w: SiteWork, tries: int) -> SiteWork | Ending:
        if self.until is not None and time.time() >= self.until:  # a round resumed late
            return Ending(not_started(self.fed), late=True, tried=False)
        return w

    def ended(self, started: dict[str, SiteWork]) -> Iterator[tuple[str, Ending]]:
        n = self.work.number
        pending = [w for w in self.work.train if w.name in started]
        training = dataclasses.replace(self.work, train=pending, average=False, evaluate=[])
        code, offset, ended = self._run(training, self.until)
        late = deadline_text(self.fed) if code is None else None
        interrupted = f"failed: the round's streamflow run failed (exit code {code})"
        outcomes = training_outcomes(training, self.files, interrupted, late)
        said = record_costs(self.fed, training, self.places, ended, interrupted, outcomes, late)
        if code != 0:
            if code is not None:
                log.warning("round %d: streamflow run failed (exit code %s)%s", n, code,
                            streamflow_errors(self.files.log, offset))  # fmt: skip
            note = self._cancel_jobs(training)
            if note:
                log.warning("round %d%s", n, note)
        for w in pending:
            outcome = outcomes[w.name]
            if outcome is None:
                yield w.name, FINISHED
                continue
            reason = said.get(w.name, "") if late and w.name in said else outcome
            yield w.name, Ending(reason, late=late is not None)

    def cancel(self, w: SiteWork, handle: SiteWork, ending: Ending) -> Ending:
        return ending  # the workflow was ended at the deadline, its SLURM jobs cancelled by name
