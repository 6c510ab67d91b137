"""The StreamFlow executor (`executor: streamflow`): what is left of a round becomes one CWL workflow
(`federation.cwl`), run by one `streamflow run` per round; the round boundary stays supertune's
restart point, since StreamFlow cannot resume a run.

Per round, under <federation dir>/streamflow/round-NNN/: round.cwl, job.yml, streamflow.yml, the
log of `streamflow run` (streamflow.log), its database, the step folders of the sites on this
machine (work/), and the outputs StreamFlow copies back (out/: the receipts). Nothing StreamFlow
says is taken on trust: a SLURM job cancelled by scancel ends with exit code 0 and counts as a
success there, so every expected output is read and checked here before the round's receipts are
written, as the built-in executor writes them. After a failed or interrupted run, the round's SLURM
jobs are cancelled by name (StreamFlow's own cleanup leaves them running), and so is what an
earlier attempt of the round left behind, before the round runs again: the jobs of a site dropped
since (`--drop`) too, which would otherwise wait in its queue and then train for nothing.

With a quorum, retries or a deadline (aggregation.min_sites, site_retries, round_deadline) a round
runs in two parts: its training, as workflows of train steps that report a failed training instead of
failing (StreamFlow would end the other sites' steps), run again for the sites not finished and ended
at the deadline; then, once the failed and late sites are left out (quorum.py), the average and the
evaluations. Every training attempt goes to the site's cost.json (cost.py): a step on this machine
records its own, a SLURM site's are its jobs of the round, found by name, with Slurm's times.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import yaml

from ....errors import UserError
from ...config.schema import FederationConfig
from ...config.site_login import login_ssh_words, plain_path
from ...rounds.failures import FederationError
from ...rounds.loop import RoundWork, SiteWork
from ...state.layout import FederationDir
from ...state.receipts import read_receipt
from .command import TESTED_VERSION, streamflow_command
from .cwl import RoundFiles, SitePlace, job_name, round_job, round_workflow, streamflow_config
from .outcomes import record_costs
from .round_outputs import keep_finished_training, record_round, streamflow_errors
from .site_check import check_site
from .site_places import federation_place, site_place

__all__ = ["StreamFlowExecutor", "streamflow_command", "TESTED_VERSION"]

log = logging.getLogger("supertune")

SERVICES = ("train", "evaluate")


class StreamFlowExecutor:
    def __init__(self, fed: FederationConfig, root: FederationDir) -> None:
        self.fed = fed
        self.root = root
        self._command: str | None = None
        self._checked: set[str] = set()
        """Sites with login whose config was checked at the site by this process."""
        self._dropped = _dropped_slurm_sites(root)
        """The SLURM sites dropped from the federation (fed holds only the others): (name, login)."""

    def run_round(self, work: RoundWork) -> None:
        if not (work.train or work.average or work.evaluate):
            return
        if not plain_path(str(self.root.path)):
            raise UserError(f"--dir: {self.root.path} must be a path of letters, digits and _./+,:@%=- with executor: streamflow "
                            "(StreamFlow passes its folders to a shell unquoted)")  # fmt: skip
        self._command = self._command or streamflow_command(self.fed)
        places = self.site_places(work)
        for site in self.fed.sites:
            if site.login and site.name not in self._checked:
                check_site(self.fed, self.root, site)
                self._checked.add(site.name)
        if work.train and self.robust():
            # A quorum, retries or a deadline: the training first, in workflows of its own whose train steps
            # report a failure instead of failing (StreamFlow would end the other sites' steps); then the
            # decision (quorum.py); then the average and the evaluations of the sites kept.
            self._train_for_quorum(work, places)
            work = dataclasses.replace(work, train=[])
            if not (work.average or work.evaluate):
                return
        n = work.number
        files = RoundFiles(self.root.streamflow / f"round-{n:03d}")
        code, offset, ended, _ = self._streamflow(work, places, files)
        if code != 0:
            keep_finished_training(work)
            record_costs(self.fed, work, places, ended, "failed: the round's streamflow run failed")
            note = self._cancel_jobs(work, places, wait=False)
            raise FederationError(
                f"round {n}: streamflow run failed (exit code {code}){streamflow_errors(files.log, offset)}{note}; the sites' own logs are in "
                f"their round folders (train.log, evaluate.log); run the federation again to run what is left of round {n}"
            )
        self._record(work, files, places)
        record_costs(self.fed, work, places, ended, "")

    def robust(self) -> bool:
        """Whether its training runs apart from the rest of the round: a quorum, retries or a deadline."""
        return bool(self.fed.aggregation.min_sites is not None or self.fed.site_retries or self.fed.round_deadline)

    def _streamflow(
        self,
        work: RoundWork,
        places: dict[str, SitePlace],
        files: RoundFiles,
        report_failure: bool = False,
        until: float | None = None,
    ) -> tuple[int | None, int, float, list[str]]:
        """One `streamflow run` of `work`: (its exit code, None when it was ended at `until`; where this
        attempt starts in StreamFlow's log; when it ended; the steps it ran)."""
        import time

        from ....subprocesses import end_group, run_group_logged
        from ...state.cost import end_running_attempts

        n = work.number
        work, steps, documents = self.documents(work, places, files, report_failure)
        if files.directory.exists():  # an earlier attempt of this round: end what it left running
            if end_group(files.group, str(self.root.path)):
                log.info("round %d: ended the processes an earlier attempt of this round left running", n)
            note = self._cancel_jobs(work, places, wait=True)
            if note:
                log.warning("round %d%s", n, note)
            for w in work.train:  # a step of a killed federation ran until now: it could not close its attempt
                if places[w.name].services is None:
                    end_running_attempts(
                        w.directory / "cost.json", time.time(), "failed: ended after the federation was killed"
                    )
        shutil.rmtree(files.outdir, ignore_errors=True)
        files.tmp.mkdir(parents=True, exist_ok=True)
        for path, text in documents.items():
            path.write_text(text, encoding="utf-8")
        log.info("round %d: streamflow run %s (%s; log %s)", n, files.streamflow, ", ".join(steps), files.log)
        assert self._command is not None
        argv = [self._command, "run", str(files.streamflow), "--outdir", str(files.outdir),
                "--name", f"{self.fed.name}-round-{n:03d}"]  # fmt: skip
        # StreamFlow's own temporary files stay in the round's folder; SLURM_CONF and the rest of
        # this environment reach sbatch where StreamFlow runs it (a slurm deployment without ssh).
        offset = files.log.stat().st_size if files.log.is_file() else 0
        code = run_group_logged(argv, files.log, files.group, env={"TMPDIR": str(files.tmp)}, until=until)
        return code, offset, time.time(), steps

    # -- a round with a quorum, retries or a deadline ----------------------------------------------

    def _train_for_quorum(self, work: RoundWork, places: dict[str, SitePlace]) -> None:
        """The round's training as workflows of train steps only, run again for the sites not finished
        (site_retries) while the deadline allows, each attempt resuming their runs from their latest
        checkpoints (training_attempts.py, under the attempt policy). The sites that failed every attempt
        or were late are left out if the others meet the quorum, else the round stops saying how to go
        on (quorum.py)."""
        from ...rounds.attempt_policy import AttemptPolicy
        from ...rounds.attempts import round_deadline
        from .training_attempts import StreamFlowTraining

        files = RoundFiles(self.root.streamflow / f"round-{work.number:03d}")
        policy = AttemptPolicy(self.fed, work, round_deadline(self.fed, work))

        def run(training: RoundWork, until: float | None) -> tuple[int | None, int, float]:
            return self._streamflow(training, places, files, report_failure=True, until=until)[:3]

        def cancel_jobs(training: RoundWork) -> str:
            return self._cancel_jobs(training, places, wait=False)

        policy.run(work.train, StreamFlowTraining(self.fed, work, places, files, policy.until, run, cancel_jobs))
        policy.leave_out()
        for name, (reason, _) in policy.failed.items():
            log.warning("%s round %d: left out of the round (%s); it trains again in the next round", name,
                        work.number, reason)  # fmt: skip

    def documents(
        self, work: RoundWork, places: dict[str, SitePlace], files: RoundFiles, report_failure: bool = False
    ) -> tuple[RoundWork, list[str], dict[Path, str]]:
        """(the work with sites trained earlier added back, its steps, {path: text} of round.cwl,
        job.yml and streamflow.yml)."""
        work, given = self._finished_training(work)
        workflow = round_workflow(
            work, places, federation_place(self.root, work.number), self.root.path, given, report_failure
        )
        job = round_job(work, given)
        steps = list(workflow["steps"])
        config = streamflow_config(self.fed, work, places, files, steps)
        documents = {files.workflow: workflow, files.job: job, files.streamflow: config}
        return work, steps, {p: yaml.safe_dump(d, sort_keys=False, width=10**6) for p, d in documents.items()}

    def site_places(self, work: RoundWork) -> dict[str, SitePlace]:
        """Where each site's files and SLURM allocations are this round, a refusal naming its site."""
        places = {}
        for site in self.fed.sites:
            try:
                places[site.name] = site_place(self.fed, self.root, site, work)
            except UserError as exc:
                raise UserError(f"site {site.name}: {exc}") from None
        return places

    def _finished_training(self, work: RoundWork) -> tuple[RoundWork, dict[str, str]]:
        """For the average, the sites that trained in an earlier attempt of the round: a checkpoint
        on this machine becomes an input; a site with login gets its train step again, which finds
        the run finished and hands its checkpoint out (the checkpoint is only at the site)."""
        if not work.average:
            return work, {}
        training = {w.name for w in work.train}
        again, given = [], {}
        for site in self.fed.sites:
            if site.name in training or site.name not in work.trained:  # not in the round, or left out of it
                continue
            sd = self.root.round(work.number).site(site.name)
            if site.login:
                again.append(SiteWork(site, work.number, sd.config, sd.path, run=sd.run, receipt=sd.trained))
                continue
            checkpoint = (read_receipt(sd.trained) or {}).get("checkpoint", "")
            if not Path(checkpoint).is_dir():
                raise FederationError(
                    f"{site.name} round {work.number}: its training receipt names the checkpoint {checkpoint!r}, which is gone; "
                    f"delete {sd.trained} to train the site's round again"
                )
            given[site.name] = checkpoint
        if not again:
            return work, given
        order = [s.name for s in self.fed.sites]
        train = sorted([*work.train, *again], key=lambda w: order.index(w.name))
        return dataclasses.replace(work, train=train), given

    # -- after the run --------------------------------------------------------------------------------

    def _record(self, work: RoundWork, files: RoundFiles, places: dict[str, SitePlace]) -> None:
        """Read and check every output the round should have made, then write its receipts."""
        record_round(work, files)

    def _cancel_jobs(self, work: RoundWork, places: dict[str, SitePlace], wait: bool) -> str:
        """scancel --name for every SLURM job of this round; with `wait`, until SLURM lists none of
        them (a cancelled training saves its checkpoint first). Returns a note on what failed."""
        import time

        from ....slurm.commands import cancel_named, named_jobs

        problems = []
        sites = [(place.name, place.login) for place in places.values() if place.services is not None]
        for site, login in [*sites, *self._dropped]:
            via = login_ssh_words(login, self.fed.streamflow.ssh_key) if login else []
            for service in SERVICES:
                name = job_name(self.fed, work.number, site, service)
                try:
                    if not named_jobs(name, via):
                        continue
                    log.info(
                        "round %d: cancelling the SLURM jobs named %s%s%s",
                        work.number,
                        name,
                        f" at {login}" if login else "",
                        " (a dropped site's)" if (site, login) in self._dropped else "",
                    )
                    cancel_named(name, via)
                    deadline = time.monotonic() + 300
                    while wait and named_jobs(name, via) and time.monotonic() < deadline:
                        time.sleep(self.fed.poll_seconds)
                except UserError as exc:
                    problems.append(f"{name}{f' at {login}' if login else ''}: {exc}")
        if problems:
            return "; could not cancel the round's SLURM jobs by name (cancel them by hand): " + "; ".join(problems)
        return ""


def _dropped_slurm_sites(root: FederationDir) -> list[tuple[str, str | None]]:
    """(name, login) of the SLURM sites dropped from the federation in `root` (state/history.py), read
    from its federation.yaml, which keeps every site; none without a drop."""
    from ...config.load import load_federation
    from ...state.history import dropped_sites

    dropped = dropped_sites(root)
    if not dropped or not root.config.is_file():
        return []
    everyone, _ = load_federation(root.path, unreadable=[])  # only names and logins are needed
    return [(s.name, s.login) for s in everyone.sites if s.name in dropped and s.where != "local"]
