"""The built-in executor: a site's work runs as a local process (`where: local`) or as a SLURM job on
a cluster this machine can submit to (`where: <cluster profile>`), with the job scripts every
`supertune submit` uses; the average runs in this process.

Local sites run one after another: they share this machine's cores. SLURM sites are all submitted
first, then waited for, asking the scheduler about each job once every `poll_seconds` at most.
A site's training resumes by itself when run again: its run directory is an ordinary supertune run.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from ..subprocesses import run_logged
from .log_tail import log_tail
from .phases import average_round, trained_record
from .receipts import read_receipt, write_receipt
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
            self._train(work.train)
        if work.average:
            receipts = [read_receipt(path) for path in work.trained.values()]
            checkpoints = [r["checkpoint"] for r in receipts if r]
            log.info("round %d: averaging %d sites into %s", work.number, len(checkpoints), work.global_model)
            average_round(
                self.fed, work.number, list(work.trained), checkpoints, work.previous, work.global_model, work.averaged
            )
        if work.evaluate:
            self._evaluate(work.evaluate, work.global_model)

    # -- training ---------------------------------------------------------------------------------

    def _train(self, works: list[SiteWork]) -> None:
        jobs = {w.name: self._submit_training(w) for w in works if w.site.where != "local"}
        for w in works:
            if w.site.where == "local":
                self._train_here(w)
                self._record(w)
        self._wait(works, jobs, "training", self._record)

    def _train_here(self, w: SiteWork) -> None:
        assert w.run is not None
        logfile = w.directory / "train.log"
        log.info("%s: training here (log %s)", w.label, logfile)
        code = run_logged([sys.executable, "-m", "supertune", "train", str(w.config), "--run-dir", str(w.run)], logfile)
        if code != 0:
            raise FederationError(
                f"{w.label}: local training stopped (exit code {code}){log_tail(logfile)}; the run in {w.run} resumes "
                "from its latest checkpoint when the federation is run again"
            )

    def _submit_training(self, w: SiteWork) -> str:
        from ..rundir import RunDir, holds_run
        from ..slurm.commands import job_state
        from ..slurm.jobs import job_records

        assert w.run is not None
        if holds_run(w.run):
            records = job_records(RunDir(w.run))
            if records and not job_state(records[-1].job_id).finished:
                log.info("%s: job %s of this round is still in the queue; waiting for it", w.label, records[-1].job_id)
                return records[-1].job_id
        logfile = w.directory / "submit.log"
        argv = [
            sys.executable,
            "-m",
            "supertune",
            "submit",
            str(w.config),
            "--cluster",
            w.site.where,
            "--run-dir",
            str(w.run),
        ]
        code = run_logged(argv, logfile)
        lines = logfile.read_text(encoding="utf-8", errors="replace").split()
        job_id = next((word for word in lines if word.isdigit()), None)
        if code != 0 or job_id is None:
            raise FederationError(f"{w.label}: supertune submit failed (exit code {code}){log_tail(logfile)}")
        log.info("%s: submitted training job %s to %s", w.label, job_id, w.site.where)
        return job_id

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
                record = evaluate_at_site(w.config, model, w.receipt)
                log.info("%s: eval loss %.4f of the global model on this site's data", w.label, record["eval_loss"])
        self._wait(works, jobs, "evaluation", lambda w: w.receipt is not None and w.receipt.is_file())

    def _submit_evaluation(self, w: SiteWork, model: Path) -> str:
        from .site_jobs import submit_evaluation

        job_id = submit_evaluation(w, model)
        log.info("%s: submitted evaluation job %s to %s", w.label, job_id, w.site.where)
        return job_id

    # -- waiting ----------------------------------------------------------------------------------

    def _wait(self, works: list[SiteWork], jobs: dict[str, str], what: str, done: Callable[[SiteWork], bool]) -> None:
        """Until every job has ended: look at each once per poll_seconds; a job that ended without its result is an error."""
        from ..slurm.commands import job_state

        pending = {w.name: w for w in works if w.name in jobs}
        last: dict[str, str] = {}
        while pending:
            for name, w in list(pending.items()):
                state = job_state(jobs[name])
                if state.state != last.get(name):
                    log.info("%s: %s job %s %s", w.label, what, jobs[name], state.state)
                    last[name] = state.state
                if not state.finished:
                    continue
                del pending[name]
                if not done(w):
                    logs = (w.run or w.directory / "evaluate") / "logs"
                    raise FederationError(
                        f"{w.label}: {what} job {jobs[name]} ended {state.state} without finishing; see {logs}; "
                        "run the federation again to resubmit it"
                    )
            if pending:
                time.sleep(self.fed.poll_seconds)
