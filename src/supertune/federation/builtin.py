"""The built-in executor: a site's work runs in local processes (`where: local`) or as a SLURM job on
a cluster this machine can submit to (`where: <cluster profile>`), started by supertune.runs as
`supertune train` and `supertune submit` start theirs; the average runs in this process.

Local sites run one after another: they share this machine's cores. SLURM sites are all submitted
first, then waited for, asking the scheduler about each job once every `poll_seconds` at most.
A site's training resumes by itself when run again: its run directory is an ordinary supertune run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from .log_tail import log_tail
from .phases import average_round, trained_record
from .receipts import checked_checkpoint, read_receipt, write_receipt
from .rounds import RoundWork, SiteWork
from .schema import FederationConfig

__all__ = ["BuiltinExecutor", "FederationError"]

log = logging.getLogger("supertune")


class FederationError(UserError):
    """A site's work failed; the message names the site, the round and where its log is."""


class BuiltinExecutor:
    def __init__(self, fed: FederationConfig) -> None:
        self.fed = fed

    def run_round(self, work: RoundWork) -> None:
        if work.train:
            self._train(work)
        if work.average:
            receipts = {name: read_receipt(path) for name, path in work.trained.items()}
            here = {s.name for s in self.fed.sites if not s.login}
            finished = {
                name: checked_checkpoint(work.trained[name], r, name, work.number) if name in here else r["checkpoint"]
                for name, r in receipts.items()
                if r
            }
            sites = f"{len(finished)} sites" if len(finished) != 1 else "the one site left"
            log.info("round %d: averaging %s into %s", work.number, sites, work.global_model)
            average_round(
                self.fed,
                work.number,
                list(finished),
                list(finished.values()),
                work.previous,
                work.global_model,
                work.averaged,
                left_out=work.left_out,
            )
        if work.evaluate:
            self._evaluate(work.evaluate, work.global_model)

    # -- training ---------------------------------------------------------------------------------

    def _train(self, work: RoundWork) -> None:
        works = work.train
        submitted = {w.name: self._submit_training(w) for w in works if w.site.where != "local"}
        jobs = {name: job_id for name, job_id in submitted.items() if job_id is not None}
        for w in works:
            if w.name in submitted and w.name not in jobs:
                self._record(w)  # finished in an earlier attempt
        failed: dict[str, tuple[str, int]] = {}
        for w in works:
            if w.site.where == "local":
                outcome = self._train_here_with_retries(w)
                if outcome is not None:
                    failed[w.name] = outcome
        self._wait(works, jobs, "training", self._record)
        if failed:
            from .quorum import leave_out_failed_sites

            leave_out_failed_sites(self.fed, work, failed)

    def _train_here_with_retries(self, w: SiteWork) -> tuple[str, int] | None:
        """Train and record a local site, again after a failure (site_retries times), each attempt
        resuming the run from its latest checkpoint. None when it finished; (reason, attempts) when every
        attempt failed and a quorum may go on without it; without a quorum the last failure is raised."""
        attempts = 1 + self.fed.site_retries
        for attempt in range(1, attempts + 1):
            try:
                self._train_here(w)
                self._record(w)
                return None
            except FederationError as exc:
                if attempt < attempts:
                    log.warning("%s: attempt %d of %d failed; trying again: %s", w.label, attempt, attempts, exc)
                    continue
                if self.fed.aggregation.min_sites is None:
                    raise
                log.warning("%s: attempt %d of %d failed: %s", w.label, attempt, attempts, exc)
                return str(exc).removeprefix(f"{w.label}: ").splitlines()[0][:300], attempts
        return None

    def _train_here(self, w: SiteWork) -> None:
        from ..resolve import resolve
        from ..runs.local import train_logged

        assert w.run is not None
        logfile = w.directory / "train.log"
        log.info("%s: training here (log %s)", w.label, logfile)
        try:
            outcome = train_logged(resolve(w.config, []), w.run, logfile)
        except UserError as exc:
            raise FederationError(f"{w.label}: {exc}") from None
        if outcome.exit_code != 0:
            raise FederationError(
                f"{w.label}: local training stopped (exit code {outcome.exit_code}){log_tail(logfile)}; the run in {w.run} resumes "
                "from its latest checkpoint when the federation is run again"
            )

    def _submit_training(self, w: SiteWork) -> str | None:
        """The site's training job: submitted, or its job still in the queue from an earlier attempt
        (waited for, not submitted twice); None when the run has finished already."""
        from ..resolve import resolve
        from ..runs.slurm import start_slurm

        assert w.run is not None
        try:
            started = start_slurm(resolve(w.config, [f"launch.cluster={w.site.where}"]), str(w.run), if_queued="keep")
        except UserError as exc:
            raise FederationError(f"{w.label}: submitting the training failed: {exc}") from None
        if started.kept:
            log.info("%s: job %s of this round is still in the queue; waiting for it", w.label, started.job_id)
        elif started.job_id is not None:
            log.info("%s: submitted training job %s to %s", w.label, started.job_id, w.site.where)
        return started.job_id

    @staticmethod
    def _record(w: SiteWork) -> bool:
        """Check the finished run's checkpoint and write the training receipt; False when the run has not finished."""
        from ..rundir import RunDir

        assert w.run is not None and w.receipt is not None
        if not RunDir(w.run).summary.is_file():
            return False
        try:
            write_receipt(w.receipt, trained_record(w.name, w.round, w.run))
        except UserError as exc:
            raise FederationError(str(exc)) from None
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
        from .site_jobs import submit_evaluation

        job_id = submit_evaluation(w, model)
        log.info("%s: submitted evaluation job %s to %s", w.label, job_id, w.site.where)
        return job_id

    # -- waiting ----------------------------------------------------------------------------------

    def _wait(self, works: list[SiteWork], jobs: dict[str, str], what: str, done: Callable[[SiteWork], bool]) -> None:
        """Until every job has ended; a job that ended without its result is an error."""
        from ..runs.wait import wait_for_jobs

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
