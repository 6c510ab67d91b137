"""The built-in executor: a site's work runs in local processes (`where: local`) or as a SLURM job on
a cluster this machine can submit to (`where: <cluster profile>`), started by supertune.runs as
`supertune train` and `supertune submit` start theirs; the average runs in this process.

Local sites run one after another: they share this machine's cores. SLURM sites are all submitted
first, then waited for, asking the scheduler about each job once every `poll_seconds` at most.
A site's training resumes by itself when run again: its run directory is an ordinary supertune run.
In buffered rounds (mode: buffered) every local site trains at once, each on its own
(buffered_training.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ....errors import UserError
from ...config.schema import FederationConfig
from ...rounds.attempt_policy import AttemptPolicy
from ...rounds.attempts import round_deadline
from ...rounds.buffered import BufferedSites
from ...rounds.failures import FederationError
from ...rounds.loop import RoundWork, SiteWork
from ...rounds.phases import average_phase
from ...state.layout import FederationDir
from ...state.receipts import checked_checkpoint, read_receipt

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

    def run_buffered(self, sites: BufferedSites) -> None:
        """mode: buffered: every local site's tasks, all sites at once, until the last version is published."""
        from .buffered_training import train_buffered

        train_buffered(self.fed, sites)

    # -- training ---------------------------------------------------------------------------------

    def train(self, work: RoundWork) -> None:
        """Every site's training of the round, under the attempt policy (rounds/attempt_policy.py): SLURM
        sites submitted first (slurm_training.py), local sites trained one after another meanwhile
        (local_training.py), then the SLURM jobs waited for. A site that fails is run again (site_retries)
        while the round's deadline allows; one still unfinished at the deadline is ended (its local
        processes, its SLURM job cancelled). Those that failed or were late are left out (quorum.py)."""
        from .local_training import LocalTraining
        from .slurm_training import SlurmTraining

        policy = AttemptPolicy(self.fed, work, round_deadline(self.fed, work))
        slurm = SlurmTraining(self.fed, policy.until)
        jobs = policy.start([w for w in work.train if w.site.where != "local"], slurm)
        local = LocalTraining(self.fed, policy.until)
        for w in work.train:
            if w.site.where == "local":
                policy.run([w], local)
        policy.wait(jobs, slurm)
        policy.leave_out()

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
        """The site's evaluation job submitted; a failed submission is tried again poll_seconds later,
        within site_retries, as a training's is (attempt_policy.submit_with_retries)."""
        from ...rounds.attempt_policy import submit_with_retries
        from ...rounds.site_jobs import submit_evaluation

        job_id = submit_with_retries(self.fed, w.label, "evaluation", lambda: submit_evaluation(w, model))
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
