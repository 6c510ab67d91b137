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
earlier attempt of the round left behind, before the round runs again.

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
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ....errors import UserError
from ...config.schema import FederationConfig, SiteConfig
from ...config.site_login import login_ssh_words, plain_path
from ...config.sites import SitePlan
from ...rounds.failures import FederationError
from ...rounds.log_tail import log_tail
from ...rounds.loop import RoundWork, SiteWork, site_config_file
from ...state.layout import FederationDir
from ...state.receipts import read_receipt, write_receipt
from .cwl import RoundFiles, SitePlace, job_name, round_job, round_workflow, slurm_service, streamflow_config
from .outcomes import record_costs, training_outcomes

__all__ = ["StreamFlowExecutor", "dry_run_documents", "streamflow_command", "TESTED_VERSION"]

log = logging.getLogger("supertune")

TESTED_VERSION = "0.2.0rc3"
SERVICES = ("train", "evaluate")


class StreamFlowExecutor:
    def __init__(self, fed: FederationConfig, root: FederationDir) -> None:
        self.fed = fed
        self.root = root
        self._command: str | None = None
        self._checked: set[str] = set()
        """Sites with login whose config was checked at the site by this process."""

    def run_round(self, work: RoundWork) -> None:
        if not (work.train or work.average or work.evaluate):
            return
        if not plain_path(str(self.root.path)):
            raise UserError(f"--dir: {self.root.path} must be a path of letters, digits and _./+,:@%=- with executor: streamflow "
                            "(StreamFlow passes its folders to a shell unquoted)")  # fmt: skip
        self._command = self._command or streamflow_command(self.fed)
        places = {s.name: self._named(s, lambda s=s: self._place(s, work)) for s in self.fed.sites}
        for site in self.fed.sites:
            if site.login and site.name not in self._checked:
                self._check_site(site)
        if work.train and self._robust():
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
            self._keep_finished_training(work)
            record_costs(self.fed, work, places, ended, "failed: the round's streamflow run failed")
            note = self._cancel_jobs(work, places, wait=False)
            raise FederationError(
                f"round {n}: streamflow run failed (exit code {code}){_errors(files.log, offset)}{note}; the sites' own logs are in "
                f"their round folders (train.log, evaluate.log); run the federation again to run what is left of round {n}"
            )
        self._record(work, files, places)
        record_costs(self.fed, work, places, ended, "")

    def _robust(self) -> bool:
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
        work, steps, documents = self._documents(work, places, files, report_failure)
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
        checkpoints; ended at the deadline (StreamFlow's processes as a group, its SLURM jobs cancelled by
        name). The sites that failed every attempt or were late are left out if the others meet the
        quorum, else the round stops saying how to go on (quorum.py)."""
        import time

        from ...rounds.attempts import leave_out, not_started, round_deadline
        from ...rounds.failures import deadline_text

        n = work.number
        files = RoundFiles(self.root.streamflow / f"round-{n:03d}")
        until = round_deadline(self.fed, work)
        attempts = 1 + self.fed.site_retries
        pending = list(work.train)
        failed: dict[str, tuple[str, int]] = {}
        for attempt in range(1, attempts + 1):
            if until is not None and time.time() >= until:
                break
            training = dataclasses.replace(work, train=pending, average=False, evaluate=[])
            code, offset, ended, _ = self._streamflow(training, places, files, report_failure=True, until=until)
            late = deadline_text(self.fed) if code is None else None
            interrupted = f"failed: the round's streamflow run failed (exit code {code})"
            outcomes = training_outcomes(training, files, interrupted, late)
            said = record_costs(self.fed, training, places, ended, interrupted, outcomes, late)
            if code != 0:
                if code is not None:
                    log.warning("round %d: streamflow run failed (exit code %s)%s", n, code, _errors(files.log, offset))
                note = self._cancel_jobs(training, places, wait=False)
                if note:
                    log.warning("round %d%s", n, note)
            pending = [w for w in pending if outcomes[w.name] is not None]
            for w in pending:
                reason = said.get(w.name, "") if late and w.name in said else outcomes[w.name] or ""
                failed[w.name] = (reason, attempt)
                again = attempt < attempts and not late
                log.warning("%s: attempt %d of %d: %s%s", w.label, attempt, attempts, reason,
                            "; trying again" if again else "")  # fmt: skip
            if not pending or late:
                break
        for w in pending:  # the deadline passed before its first attempt (a round resumed late)
            failed.setdefault(w.name, (not_started(self.fed), 0))
        if pending:
            left = {w.name: failed[w.name] for w in pending}
            leave_out(self.fed, work, left, until)
            for name, (reason, _) in left.items():
                log.warning(
                    "%s round %d: left out of the round (%s); it trains again in the next round", name, n, reason
                )

    def _documents(
        self, work: RoundWork, places: dict[str, SitePlace], files: RoundFiles, report_failure: bool = False
    ) -> tuple[RoundWork, list[str], dict[Path, str]]:
        """(the work with sites trained earlier added back, its steps, {path: text} of round.cwl,
        job.yml and streamflow.yml)."""
        work, given = self._finished_training(work)
        workflow = round_workflow(work, places, self._here(work.number), self.root.path, given, report_failure)
        job = round_job(work, given)
        steps = list(workflow["steps"])
        config = streamflow_config(self.fed, work, places, files, steps)
        documents = {files.workflow: workflow, files.job: job, files.streamflow: config}
        return work, steps, {p: yaml.safe_dump(d, sort_keys=False, width=10**6) for p, d in documents.items()}

    @staticmethod
    def _named(site: SiteConfig, make):
        """`make()`, with any refusal naming the site it is about."""
        try:
            return make()
        except UserError as exc:
            raise UserError(f"site {site.name}: {exc}") from None

    def _check_site(self, site: SiteConfig) -> None:
        """Before the first round this process runs: log in to the site's login node and check the
        site's run config there, where its data and tokenizer are (`site-task check`). One SSH
        login per site (about a second, plus the site's Python starting); any refusal names the
        site and its login node."""
        import shlex

        from ....entry import SITE_TASK, entry_words
        from ....subprocesses import run_captured

        assert site.login is not None and site.python is not None  # config/site_login.py requires both with login
        remote = " ".join(
            shlex.quote(str(w)) for w in [site.python, *entry_words(SITE_TASK, ["check", "--site", site.name])]
        )
        ssh = login_ssh_words(site.login, self.fed.streamflow.ssh_key, connect_timeout=30)
        text = site_config_file(self.root, site.name).read_text(encoding="utf-8")
        log.info("site %s: checking its run config at %s", site.name, site.login)
        answer = run_captured([*ssh, remote], timeout=300, input=text)
        if answer.returncode == 0:
            self._checked.add(site.name)
            return
        said = [line.strip() for line in (answer.stderr + answer.stdout).splitlines() if line.strip()]
        errors = [
            line.removeprefix("supertune: error: ") for line in said if line.startswith(("supertune: error:", "- "))
        ]
        reason = said[-1] if said else f"exit code {answer.returncode}"
        if answer.returncode == 255:
            # ssh's own failures (an unknown host, a refused key, no route) exit 255 and name neither site nor host.
            raise FederationError(
                f"site {site.name}: login node {site.login} cannot be used over SSH: {reason}; check sites[].login and "
                f"that `{' '.join(ssh)} true` succeeds from this machine without a prompt"
            )
        if answer.returncode == 127:
            raise FederationError(
                f"site {site.name}: {site.python} was not found at {site.login} ({reason}); set sites[].python to the "
                "site's Python with supertune installed"
            )
        if not errors:  # e.g. a supertune at the site too old for `site-task check`
            raise FederationError(
                f"site {site.name}: the check of its run config at {site.login} failed (exit code {answer.returncode}): "
                f"{reason}; install the same supertune version at the site as here"
            )
        raise FederationError(
            f"site {site.name}: its run config was refused at {site.login}, where its files are:\n  "
            + "\n  ".join(errors)
        )

    # -- where each site's files are ----------------------------------------------------------------

    def _here(self, number: int) -> SitePlace:
        """The federation's machine, where the average runs."""
        return SitePlace("federation", str(self.root.round(number).path), sys.executable, _local_env())

    def _place(self, site: SiteConfig, work: RoundWork) -> SitePlace:
        n = work.number
        if site.login:
            assert site.workdir is not None and site.python is not None  # config/site_login.py requires both with login
            base = f"{site.workdir.rstrip('/')}/{self.fed.name}"
            site_dir, python, env = f"{base}/round-{n:03d}/{site.name}", site.python, {}
            workdir: str | None = f"{base}/streamflow/round-{n:03d}/{site.name}"
        else:
            site_dir, python, env, workdir = (
                str(self.root.round(n).site(site.name).path),
                sys.executable,
                _local_env(),
                None,
            )
        services = self._services(site, work, site_dir, python) if site.where != "local" else None
        return SitePlace(site.name, site_dir, python, env, site.login, workdir, services)

    def _services(self, site: SiteConfig, work: RoundWork, site_dir: str, python: str) -> dict[str, dict[str, Any]]:
        """The SLURM allocations of the site's steps: what its job scripts ask for (job_spec)."""
        from ....clusters import load_profile
        from ....config.load import load_saved_config
        from ....slurm.job import job_spec
        from ...rounds.site_jobs import evaluation_job

        profile = load_profile(site.where, what=f"site {site.name}: where")
        # A site reached over SSH has its data and models there: only its config's types and keys are read here.
        here = not site.login
        base = load_saved_config(site_config_file(self.root, site.name), files_here=here)
        round_config = self.root.round(work.number).site(site.name).config
        trained = load_saved_config(round_config, files_here=here) if round_config.is_file() else base
        train = job_spec(trained, profile, f"{site_dir}/run", python)
        evaluate = evaluation_job(base, profile, Path(site_dir) / "evaluate", site.name, ("", "", ""))
        return {
            "train": slurm_service(train, job_name(self.fed, work.number, site.name, "train")),
            "evaluate": slurm_service(evaluate, job_name(self.fed, work.number, site.name, "evaluate")),
        }

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
        from ....averaging import read_average_manifest
        from ...rounds.phases import trained_record

        n = work.number
        for w in work.train:
            record = _output(files, f"trained-{w.name}.json", f"{w.label}: training")
            if record.get("site") != w.name or record.get("round") != n or not isinstance(record.get("tokens"), int):
                raise FederationError(
                    f"{w.label}: {files.outdir / f'trained-{w.name}.json'} is not this site's training receipt of round {n}"
                )
            if not w.site.login:
                # On this machine: checked again here, the checkpoint's files against its manifest.
                assert w.run is not None
                try:
                    record = trained_record(w.name, n, w.run)
                except UserError as exc:
                    raise FederationError(str(exc)) from None
            assert w.receipt is not None
            write_receipt(w.receipt, record)
        if work.average:
            record = _output(files, "averaged.json", f"round {n}: average")
            try:
                manifest = read_average_manifest(work.global_model)
            except ValueError as exc:
                raise FederationError(
                    f"round {n}: the average reported success, but {work.global_model} is not a published average ({exc})"
                ) from None
            if record.get("round") != n or len(manifest.inputs) != len(work.trained):
                raise FederationError(
                    f"round {n}: {files.outdir / 'averaged.json'} does not describe the average in {work.global_model}"
                )
            write_receipt(work.averaged, record)
        for w in work.evaluate:
            record = _output(files, f"evaluated-{w.name}.json", f"{w.label}: evaluation")
            loss = record.get("eval_loss")
            if not isinstance(loss, (int, float)) or not math.isfinite(loss):
                raise FederationError(f"{w.label}: {files.outdir / f'evaluated-{w.name}.json'} has no finite eval_loss")
            # What was evaluated: the round's global model (the site read StreamFlow's copy of it).
            record = {**record, "model": str(work.global_model)}
            assert w.receipt is not None
            write_receipt(w.receipt, record)
            log.info("%s: eval loss %.4f of the global model on this site's data", w.label, loss)

    def _keep_finished_training(self, work: RoundWork) -> None:
        """After a failed run: the receipts of runs on this machine that did finish (the next
        attempt would only hand their checkpoints out again)."""
        from ...rounds.phases import trained_record

        for w in work.train:
            if not w.site.login and w.run is not None and w.receipt is not None:
                try:
                    write_receipt(w.receipt, trained_record(w.name, w.round, w.run))
                except UserError:
                    continue  # not finished: it resumes from its latest checkpoint next time

    def _cancel_jobs(self, work: RoundWork, places: dict[str, SitePlace], wait: bool) -> str:
        """scancel --name for every SLURM job of this round; with `wait`, until SLURM lists none of
        them (a cancelled training saves its checkpoint first). Returns a note on what failed."""
        import time

        from ....slurm.commands import cancel_named, named_jobs

        problems = []
        for place in places.values():
            if place.services is None:
                continue
            via = login_ssh_words(place.login, self.fed.streamflow.ssh_key) if place.login else []
            for service in SERVICES:
                name = job_name(self.fed, work.number, place.name, service)
                try:
                    if not named_jobs(name, via):
                        continue
                    log.info(
                        "round %d: cancelling the SLURM jobs named %s%s",
                        work.number,
                        name,
                        f" at {place.login}" if place.login else "",
                    )
                    cancel_named(name, via)
                    deadline = time.monotonic() + 300
                    while wait and named_jobs(name, via) and time.monotonic() < deadline:
                        time.sleep(self.fed.poll_seconds)
                except UserError as exc:
                    problems.append(f"{name}{f' at {place.login}' if place.login else ''}: {exc}")
        if problems:
            return "; could not cancel the round's SLURM jobs by name (cancel them by hand): " + "; ".join(problems)
        return ""


def _errors(log: Path, offset: int, limit: int = 4) -> str:
    """What went wrong in this attempt, from StreamFlow's log (appended to by every attempt): its
    ERROR lines with the step's message under each, once each; else the log's last lines."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return f" (log: {log})"
    found: list[str] = []
    for i, line in enumerate(lines):
        if " ERROR " not in line:
            continue
        detail = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith(("\t", " ")) else ""
        entry = f"{line.split(' ERROR ', 1)[1].strip()} {detail}".strip()
        if entry not in found:
            found.append(entry)
    if not found:
        return log_tail(log, 8)
    return ":\n    " + "\n    ".join(found[:limit]) + f"\n  (StreamFlow's whole log: {log})"


def _output(files: RoundFiles, name: str, what: str) -> dict[str, Any]:
    path = files.outdir / name
    record = read_receipt(path)
    if record is None:
        raise FederationError(
            f"{what}: StreamFlow reported success but left no {name} in {files.outdir} (a SLURM job cancelled from outside "
            f"ends as a success there); see {files.log}; run the federation again"
        )
    return record


def _local_env() -> dict[str, str]:
    """HOME and the caches of this machine's steps: a CWL runner sets HOME to the step's folder,
    which would hide the Hugging Face cache, supertune's cache and the user's cluster profiles; and
    it clears the rest of the environment, PYTHONPATH included."""
    from ....paths import cache_dir

    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    env = {
        "HOME": home,
        "SUPERTUNE_CACHE": str(cache_dir().absolute()),
        "HF_HOME": os.path.abspath(os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")),
    }
    if os.environ.get("SUPERTUNE_CONFIG_DIR"):
        env["SUPERTUNE_CONFIG_DIR"] = os.path.abspath(os.path.expanduser(os.environ["SUPERTUNE_CONFIG_DIR"]))
    if os.environ.get("PYTHONPATH"):  # the steps run the supertune this federation runs (a source checkout's src)
        env["PYTHONPATH"] = ":".join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(":") if p)
    for key, value in env.items():
        if not plain_path(value):
            raise UserError(f"{key}: {value!r} must be a path of letters, digits and _./+,:@%=- with executor: streamflow "
                            "(StreamFlow exports it in a shell command unquoted)")  # fmt: skip
    return env


def dry_run_documents(fed: FederationConfig, plans: list[SitePlan], root: FederationDir) -> dict[Path, str]:
    """StreamFlow's files of round 1 as a new federation in `root` writes them when round 1 starts
    ({path under root: text}), for `federate --dry-run`; nothing is written under root.

    They are made in a temporary copy of the federation directory (the sites' configs written there,
    as a real run writes them, and standing for round 1's resolved configs), whose path is then
    replaced by root's in the texts; the temporary copy is removed. A resumed federation writes the same files
    for the rounds it has left, less the phases already done. The federation's id is made when the
    federation starts: the texts show <federation id> in its place. No login node is reached."""
    import tempfile

    from ...config.lora_modes import lora_sites
    from ...rounds.loop import round_work

    with tempfile.TemporaryDirectory(prefix="supertune-dry-run-") as tmp:
        scratch = FederationDir(Path(tmp) / "federation")
        for plan in plans:
            path = site_config_file(scratch, plan.site.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(plan.text, encoding="utf-8")
        base = Path(fed.base_model) if fed.base_model else scratch.round(0).global_model
        adapters = lora_sites(fed, [p.config for p in plans]) == "adapters"
        previous = scratch.round(0).path / "adapter" if adapters else base
        for plan in plans:
            # Round 1's resolved config differs from the site's only in its steps and start model
            # (built when the federation starts), which no StreamFlow file holds: the file's path is given.
            config = scratch.round(1).site(plan.site.name).config
            config.parent.mkdir(parents=True)
            config.write_text(plan.text, encoding="utf-8")
        work = round_work(fed, plans, scratch, 1, previous, base)
        work.federation_id = "<federation id>"
        executor = StreamFlowExecutor(fed, scratch)
        files = RoundFiles(scratch.streamflow / "round-001")
        places = {s.name: executor._named(s, lambda s=s: executor._place(s, work)) for s in fed.sites}
        if executor._robust():  # round 1 starts with its training alone (run_round)
            work = dataclasses.replace(work, average=False, evaluate=[])
        _, _, documents = executor._documents(work, places, files, report_failure=executor._robust())
        here, there = str(scratch.path), str(root.path)
        return {Path(str(p).replace(here, there, 1)): text.replace(here, there) for p, text in documents.items()}


def streamflow_command(fed: FederationConfig) -> str:
    """The streamflow executable: streamflow.command (a path, or a name on PATH); for the default
    name, <repo>/.venv-streamflow/bin/streamflow (scripts/env.sh makes it) when PATH has none.
    Its version is checked: 0.1.x cannot run these workflows."""
    from ....subprocesses import run_captured

    command = fed.streamflow.command
    found = shutil.which(os.path.expanduser(command))
    if found is None and command == "streamflow":
        import supertune

        beside = Path(supertune.__file__).resolve().parents[2] / ".venv-streamflow" / "bin" / "streamflow"
        found = str(beside) if os.access(beside, os.X_OK) else None
    if found is None:
        raise UserError(
            f"streamflow.command: {command!r} is not an executable here; install StreamFlow {TESTED_VERSION} "
            "(`bash scripts/env.sh` makes .venv-streamflow in a source checkout, or `pip install 'supertune[streamflow]'`), "
            "or set streamflow.command to its path"
        )
    answer = run_captured([found, "version"], timeout=120)
    version = answer.stdout.strip().rsplit(" ", 1)[-1] if answer.returncode == 0 else ""
    if not version.startswith("0.2"):
        raise UserError(f"streamflow.command: {found} is StreamFlow {version or '(no version answered)'}; the federation needs {TESTED_VERSION} "
                        "(0.1.x has no local deployment and always runs sbatch over SSH)")  # fmt: skip
    if version != TESTED_VERSION:
        log.warning("StreamFlow %s: the federation is tested with %s", version, TESTED_VERSION)
    return found
