"""The built-in executor's attempts of a SLURM site's training (`where: <cluster profile>`): an
attempt is a job, submitted (or, from an earlier run of the round, found still queued and waited for,
not submitted twice), waited for with the others, asking the scheduler once every `poll_seconds` at
most, and cancelled at the round's deadline. A submission that failed (the cluster unreachable: a VPN
down, a login node gone; sbatch refused it) is an attempt too, tried again `poll_seconds` later: a
blip of the network costs an attempt, not the round. The attempt policy (rounds/attempt_policy.py)
decides what follows an attempt, and writes each to the site's cost.json with Slurm's times (its
Ending's cost)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ....errors import UserError
from ...config.schema import FederationConfig
from ...rounds.attempt_policy import FINISHED, Ending
from ...rounds.attempts import reason_of
from ...rounds.failures import FederationError, deadline_text, job_exit_text, late_job_reason
from ...rounds.loop import SiteWork
from ...rounds.phases import record_finished_training
from ...state.cost import Attempt, slurm_attempt

__all__ = ["SlurmTraining"]

log = logging.getLogger("supertune")


class SlurmTraining:
    """An AttemptRunner whose handles are SLURM job ids."""

    batch = False

    def __init__(self, fed: FederationConfig, until: float | None) -> None:
        self.fed, self.until = fed, until
        self._works: dict[str, SiteWork] = {}
        self._states: dict[str, Any] = {}
        """The last state of each job found unfinished at the deadline (what its cancelled attempt records)."""

    def start(self, w: SiteWork, tries: int) -> str | Ending:
        self._works[w.name] = w
        try:
            job_id = self._submit(w)
        except FederationError as exc:
            reason = exc.reason or "failed: submitting its job"
            nothing_ran = Attempt(job=None, nodes=None, submit=None, start=None, end=None, outcome=reason)
            return Ending(reason, str(exc), pause=self.fed.poll_seconds, cost=nothing_ran)
        if job_id is not None:
            return job_id
        try:  # its run finished in an earlier attempt: only its checkpoint is checked (nothing is left to train)
            if record_finished_training(w):
                return FINISHED
        except FederationError as exc:
            return Ending(exc.reason or "refused", str(exc), again=False)
        return Ending(
            "failed: its run has not finished",
            f"{w.label}: no job was submitted, and the run in {w.run} has not finished",
            again=False,
        )

    def ended(self, started: dict[str, str]) -> Iterator[tuple[str, Ending]]:
        from ....runs.wait import wait_for_jobs

        def changed(name: str, state) -> None:
            log.info("%s: training job %s %s", self._works[name].label, started[name], state.state)

        for name, state in wait_for_jobs(started, self.fed.poll_seconds, changed, until=self.until):
            w, job_id = self._works[name], started[name]
            if not state.finished:  # the deadline passed: the node-hours it would still take are not spent
                self._states[name] = state
                yield name, Ending(late_job_reason(state, deadline_text(self.fed)), late=True)
                continue
            try:
                done = record_finished_training(w)
                reason = "finished" if done else f"failed: {job_exit_text(state)}"
            except FederationError as exc:
                done, reason = False, exc.reason or "refused"
            cost = slurm_attempt(job_id, state, reason)
            if done:
                yield name, Ending(cost=cost)
                continue
            message = (
                f"{w.label}: training job {job_id} ended {state.state} without finishing ({reason}); "
                f"see {w.run / 'logs' if w.run else w.directory}; run the federation again to resubmit it"
            )
            yield name, Ending(reason, message, cost=cost)

    def cancel(self, w: SiteWork, handle: str, ending: Ending) -> Ending:
        from ....slurm.commands import cancel_job

        cancel_job(handle)
        assert ending.reason is not None
        cost = slurm_attempt(handle, self._states.pop(w.name), ending.reason, cancelled=True)
        return Ending(ending.reason, ending.message, late=True, note=f"job {handle} cancelled", cost=cost)

    def _submit(self, w: SiteWork) -> str | None:
        """The site's training job: submitted, or its job still in the queue from an earlier attempt
        (waited for, not submitted twice); None when the run has finished already."""
        from ....resolve import resolve
        from ....runs.slurm import start_slurm

        assert w.run is not None
        try:
            started = start_slurm(resolve(w.config, [f"launch.cluster={w.site.where}"]), str(w.run), if_queued="keep")
        except UserError as exc:
            said = reason_of(exc)
            raise FederationError(
                f"{w.label}: submitting the training failed: {exc}", reason=f"failed: submitting its job: {said}"
            ) from None
        if started.kept:
            log.info("%s: job %s of this round is still in the queue; waiting for it", w.label, started.job_id)
        elif started.job_id is not None:
            log.info("%s: submitted training job %s to %s", w.label, started.job_id, w.site.where)
        return started.job_id
