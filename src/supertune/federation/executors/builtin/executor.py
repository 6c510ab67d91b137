"""The built-in executor: a site's work runs in local processes (`where: local`) or as a SLURM job on
a cluster this machine can submit to (`where: <cluster profile>`), started by supertune.runs as
`supertune train` and `supertune submit` start theirs; the average runs in this process.

Local sites run one after another: they share this machine's cores. SLURM sites are all submitted
first, then waited for, asking the scheduler about each job once every `poll_seconds` at most.
A site's training resumes by itself when run again: its run directory is an ordinary supertune run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ....errors import UserError
from ...config.schema import FederationConfig
from ...rounds.attempts import leave_out, not_started, reason_of, round_deadline
from ...rounds.failures import FederationError, SiteLate, deadline_text, job_exit_text, late_job_reason
from ...rounds.log_tail import log_tail
from ...rounds.loop import RoundWork, SiteWork
from ...rounds.phases import average_phase, trained_record
from ...state.layout import FederationDir
from ...state.receipts import checked_checkpoint, read_receipt, write_trained

__all__ = ["BuiltinExecutor", "builtin_executor"]

log = logging.getLogger("supertune")


def builtin_executor(fed: FederationConfig, root: FederationDir) -> BuiltinExecutor:
    """The executor's factory (config/executors.py's EXECUTORS): it keeps everything in the sites' run
    directories, so the federation directory is not its concern."""
    return BuiltinExecutor(fed)


class BuiltinExecutor:
    def __init__(self, fed: FederationConfig) -> None:
        self.fed = fed

    def run_round(self, work: RoundWork) -> None:
        if work.train:
            self.train(work)
        if work.average:
            receipts = {name: read_receipt(path) for name, path in work.trained.items()}
            here = {s.name for s in self.fed.sites if not s.login}
            finished = {
                name: checked_checkpoint(work.trained[name], r, name, work.number) if name in here else r["checkpoint"]
                for name, r in receipts.items()
                if r
            }
            if self.fed.transfer.active:
                finished = self._sent(work, finished)
            average_phase(self.fed, work, finished)
        if work.evaluate:
            self._evaluate(work.evaluate, work.global_model)

    def _sent(self, work: RoundWork, finished: dict[str, str]) -> dict[str, str]:
        """Each finished site's result as it travels (transfer settings): a package in its folder of the round."""
        from ...rounds.site_result import send_result

        root = FederationDir(work.averaged.parent.parent)
        packages = {}
        for name, checkpoint in finished.items():
            package = send_result(self.fed, root, work.number, name, checkpoint, work.previous)
            what = "its change" if package.delta else "its model"
            log.info("%s round %d: sends %s (%s in %s, %.2f MB of weights)", name, work.number, package.directory, what,
                     package.codec.name, package.sent_weight_bytes / 1e6)  # fmt: skip
            packages[name] = str(package.directory)
        return packages

    # -- training ---------------------------------------------------------------------------------

    def train(self, work: RoundWork) -> None:
        """Every site's training of the round: SLURM sites submitted first, local sites trained one after
        another meanwhile, then the SLURM jobs waited for. A site that fails is run again (site_retries)
        while the round's deadline allows; one still unfinished at the deadline is ended (its local
        processes, its SLURM job cancelled). Those that failed or were late are left out (quorum.py)."""
        works = work.train
        until = round_deadline(self.fed, work)
        failed: dict[str, tuple[str, int]] = {}
        submitted: dict[str, str | None] = {}
        for w in works:
            if w.site.where == "local":
                continue
            job_id, attempts, reason = self._submit_with_retries(w, until)
            if reason is None:
                submitted[w.name] = job_id
            else:
                failed[w.name] = (reason, attempts)
        jobs = {name: job_id for name, job_id in submitted.items() if job_id is not None}
        for w in works:
            if w.name in submitted and w.name not in jobs:
                self._record(w)  # finished in an earlier attempt
        for w in works:
            if w.site.where == "local":
                outcome = self._train_here_with_retries(w, until)
                if outcome is not None:
                    failed[w.name] = outcome
        failed.update(self._wait_for_training(works, jobs, until))
        if failed:
            leave_out(self.fed, work, failed, until)

    def _give_up(self, exc: FederationError, until: float | None) -> bool:
        """Whether a site's last failure stops the federation at once: no quorum and no deadline to decide by."""
        return self.fed.aggregation.min_sites is None and until is None and not isinstance(exc, SiteLate)

    def _train_here_with_retries(self, w: SiteWork, until: float | None) -> tuple[str, int] | None:
        """Train and record a local site, again after a failure (site_retries times, while the deadline has
        not passed), each attempt resuming the run from its latest checkpoint. None when it finished;
        (reason, attempts) when it failed every attempt or was late, for a quorum to go on without it;
        without a quorum and a deadline the last failure is raised."""

        attempts = 1 + self.fed.site_retries
        reason = None
        for attempt in range(1, attempts + 1):
            if until is not None and time.time() >= until:
                if reason is None:
                    local = sum(s.where == "local" for s in self.fed.sites)
                    reason = not_started(
                        self.fed, " (the sites on this machine train one after another)" if local > 1 else ""
                    )
                    log.warning("%s: %s; left for the quorum", w.label, reason)
                return reason, attempt - 1
            try:
                self._train_here(w, until)
                self._record(w)
                return None
            except FederationError as exc:
                reason = exc.reason or reason_of(exc, w.label)
                if isinstance(exc, SiteLate):
                    log.warning("%s: %s; its processes were ended", w.label, reason)
                    return reason, attempt
                if attempt < attempts:
                    log.warning("%s: attempt %d of %d failed; trying again: %s", w.label, attempt, attempts, exc)
                    continue
                if self._give_up(exc, until):
                    raise
                log.warning("%s: attempt %d of %d failed: %s", w.label, attempt, attempts, exc)
                return reason, attempts
        return None

    def _train_here(self, w: SiteWork, until: float | None = None) -> None:
        from ....resolve import resolve
        from ....runs.local import train_logged
        from ...state.cost import Attempt, record_attempt

        assert w.run is not None
        logfile = w.directory / "train.log"
        log.info("%s: training here (log %s)", w.label, logfile)
        started = time.time()
        try:
            resolution = resolve(w.config, [])
            outcome = train_logged(resolution, w.run, logfile, until=until)
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
        record_attempt(
            w.directory / "cost.json",
            Attempt(job=None, nodes=1, submit=started, start=started, end=ended, outcome=result, processes=nproc),
        )
        if outcome.late:
            raise SiteLate(f"{w.label}: {result}; its processes were ended", reason=result)
        if code != 0:
            raise FederationError(
                f"{w.label}: local training stopped (exit code {code}){log_tail(logfile)}; the run in {w.run} resumes "
                "from its latest checkpoint when the federation is run again",
                reason=result,
            )

    def _submit_with_retries(
        self, w: SiteWork, until: float | None, tries: int = 1
    ) -> tuple[str | None, int, str | None]:
        """Submit the site's training job (`tries`: the attempt this is), again after a submission that
        failed (its cluster unreachable: a VPN down, a login node gone; sbatch refused it) while
        site_retries and the deadline allow, `poll_seconds` apart: a blip of the network costs an
        attempt, not the round. Each failed submission is an attempt of the site's training, in its
        cost.json without a job or node time. Returns (job id, or None when the run has finished
        already; the attempt; None) or, every attempt failed, (None, the attempts, the reason); without
        a quorum and a deadline the last failure is raised."""
        from ...state.cost import Attempt, record_attempt

        attempts = 1 + self.fed.site_retries
        while True:
            try:
                return self._submit_training(w), tries, None
            except FederationError as exc:
                reason = exc.reason or "failed: submitting its job"
                record_attempt(
                    w.directory / "cost.json",
                    Attempt(job=None, nodes=None, submit=None, start=None, end=None, outcome=reason),
                )
                pause = self.fed.poll_seconds
                if tries < attempts and (until is None or time.time() + pause < until):
                    log.warning("%s: attempt %d of %d failed; trying again in %gs: %s", w.label, tries, attempts,
                                pause, exc)  # fmt: skip
                    time.sleep(pause)
                    tries += 1
                    continue
                if self._give_up(exc, until):
                    raise
                log.warning("%s: attempt %d of %d failed: %s", w.label, tries, attempts, exc)
                return None, tries, reason

    def _submit_training(self, w: SiteWork) -> str | None:
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

    def _wait_for_training(
        self, works: list[SiteWork], jobs: dict[str, str], until: float | None
    ) -> dict[str, tuple[str, int]]:
        """Wait for the SLURM sites' training jobs: a job that ended without a finished run is submitted
        again (site_retries, while the deadline has not passed); at the deadline the jobs still queued or
        running are cancelled. Returns the sites that failed or were late: (reason, attempts)."""
        from ....runs.wait import wait_for_jobs
        from ....slurm.commands import cancel_job
        from ...state.cost import record_attempt, slurm_attempt

        named = {w.name: w for w in works}
        tries = dict.fromkeys(jobs, 1)
        failed: dict[str, tuple[str, int]] = {}

        def changed(name: str, state) -> None:
            log.info("%s: training job %s %s", named[name].label, jobs[name], state.state)

        while jobs:
            again: dict[str, str] = {}
            for name, state in wait_for_jobs(jobs, self.fed.poll_seconds, changed, until=until):
                w, job_id = named[name], jobs[name]
                if not state.finished:  # the deadline passed: the node-hours it would still take are not spent
                    cancel_job(job_id)
                    reason = late_job_reason(state, deadline_text(self.fed))
                    log.warning("%s: %s; job %s cancelled", w.label, reason, job_id)
                    record_attempt(w.directory / "cost.json", slurm_attempt(job_id, state, reason, cancelled=True))
                    failed[name] = (reason, tries[name])
                    continue
                try:
                    done = self._record(w)
                    reason = "finished" if done else f"failed: {job_exit_text(state)}"
                except FederationError as exc:
                    done, reason = False, exc.reason or "refused"
                record_attempt(w.directory / "cost.json", slurm_attempt(job_id, state, reason))
                if done:
                    continue
                message = (
                    f"{w.label}: training job {job_id} ended {state.state} without finishing ({reason}); "
                    f"see {w.run / 'logs' if w.run else w.directory}; run the federation again to resubmit it"
                )
                if tries[name] <= self.fed.site_retries and (until is None or time.time() < until):
                    log.warning("%s: attempt %d of %d failed; trying again: %s", w.label, tries[name],
                                1 + self.fed.site_retries, message)  # fmt: skip
                    resubmitted, tries[name], failure = self._submit_with_retries(w, until, tries[name] + 1)
                    if failure is not None:
                        failed[name] = (failure, tries[name])
                    elif resubmitted is not None:
                        again[name] = resubmitted
                    elif not self._checked_again(w):  # its run had finished: only its checkpoint's check failed
                        if self._give_up(FederationError(message), until):
                            raise FederationError(message, reason=reason)
                        failed[name] = (reason, tries[name])
                    continue
                if self.fed.aggregation.min_sites is None and until is None:
                    raise FederationError(message, reason=reason)
                log.warning("%s: attempt %d failed: %s", w.label, tries[name], message)
                failed[name] = (reason, tries[name])
            jobs = again
        return failed

    def _checked_again(self, w: SiteWork) -> bool:
        """A finished run whose checkpoint was refused, checked once more instead of trained again (there is
        nothing left to train): True when it now passes and its receipt is written."""
        try:
            return self._record(w)
        except FederationError:
            return False

    @staticmethod
    def _record(w: SiteWork) -> bool:
        """Check the finished run's checkpoint and write the training receipt; False when the run has not finished."""
        from ....rundir import RunDir

        assert w.run is not None and w.receipt is not None
        if not RunDir(w.run).summary.is_file():
            return False
        try:
            write_trained(w.receipt, trained_record(w.name, w.round, w.run))
        except UserError as exc:  # its checkpoint does not match its manifest: not averaged
            said = str(exc).removeprefix(f"{w.label}: ")
            raise FederationError(str(exc), reason=f"refused: {reason_of(said)}") from None
        return True

    # -- evaluation -------------------------------------------------------------------------------

    def _evaluate(self, works: list[SiteWork], model: Path) -> None:
        """The global model's loss on every site's validation data, where that data is."""
        from .site_eval import evaluate_at_site

        jobs = {w.name: self._submit_evaluation(w, model) for w in works if w.site.where != "local"}
        for w in works:
            if w.site.where == "local":
                assert w.receipt is not None
                try:
                    record = evaluate_at_site(w.config, model, w.receipt)
                except UserError as exc:
                    raise FederationError(f"{w.label}: evaluation: {exc}") from None
                log.info("%s: eval loss %.4f of the global model on this site's data", w.label, record["eval_loss"])
        self._wait(works, jobs, "evaluation", lambda w: w.receipt is not None and w.receipt.is_file())

    def _submit_evaluation(self, w: SiteWork, model: Path) -> str:
        from ...rounds.site_jobs import submit_evaluation

        job_id = submit_evaluation(w, model)
        log.info("%s: submitted evaluation job %s to %s", w.label, job_id, w.site.where)
        return job_id

    # -- waiting ----------------------------------------------------------------------------------

    def _wait(self, works: list[SiteWork], jobs: dict[str, str], what: str, done: Callable[[SiteWork], bool]) -> None:
        """Until every job has ended; a job that ended without its result is an error."""
        from ....runs.wait import wait_for_jobs

        named = {w.name: w for w in works}

        def changed(name: str, state) -> None:
            log.info("%s: %s job %s %s", named[name].label, what, jobs[name], state.state)

        for name, state in wait_for_jobs(jobs, self.fed.poll_seconds, changed):
            w = named[name]
            if not done(w):
                logs = (w.run or w.directory / "evaluate") / "logs"
                raise FederationError(
                    f"{w.label}: {what} job {jobs[name]} ended {state.state} without finishing; see {logs}; "
                    "run the federation again to resubmit it"
                )
