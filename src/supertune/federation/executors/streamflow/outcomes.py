"""What the train steps of a StreamFlow round came to, and what they cost: each step's outcome read
from what it handed back (a finished training's receipt written here, a checkpoint on this machine
checked against its manifest; else the failure the step reported, or why it never reported), and
every attempt in the site's cost.json (cost.py): a step on this machine records its own, a SLURM
site's attempts are its jobs of the round, found by name (cwl.job_name), with Slurm's own times.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ....errors import UserError
from ...config.schema import FederationConfig
from ...config.site_login import login_ssh_words
from ...rounds.attempts import cut_reason, reason_of
from ...rounds.loop import RoundWork
from ...state.receipts import read_receipt, write_receipt, write_trained
from .cwl import RoundFiles, SitePlace, job_name

__all__ = ["training_outcomes", "record_costs", "failure_reported"]

log = logging.getLogger("supertune")


def training_outcomes(work: RoundWork, files: RoundFiles, interrupted: str, late: str | None) -> dict[str, str | None]:
    """Each train step's outcome after a training workflow: None for a finished training (its receipt
    written, a checkpoint on this machine checked against its manifest), else the reason it did not
    finish (the step's own report, or why it never reported)."""
    from ....rundir import RunDir
    from ...rounds.phases import trained_record

    outcomes: dict[str, str | None] = {}
    for w in work.train:
        assert w.receipt is not None
        path = files.outdir / f"trained-{w.name}.json"
        reported = failure_reported(path)
        if reported:
            outcomes[w.name] = reported
            continue
        try:
            record = read_receipt(path)
        except UserError as exc:
            outcomes[w.name] = f"refused: {cut_reason(str(exc))}"
            continue
        if not w.site.login:  # the run is on this machine: read here (the step may have been ended after it)
            assert w.run is not None
            if RunDir(w.run).summary.is_file():
                try:
                    write_trained(w.receipt, trained_record(w.name, w.round, w.run))
                    outcomes[w.name] = None
                except UserError as exc:
                    said = reason_of(exc, w.label)
                    outcomes[w.name] = f"refused: {said}"
                continue
        elif record is not None and record.get("site") == w.name and record.get("round") == w.round:
            write_receipt(w.receipt, record)
            outcomes[w.name] = None
            continue
        outcomes[w.name] = f"late: running after {late}" if late else interrupted
    return outcomes


def record_costs(
    fed: FederationConfig,
    work: RoundWork,
    places: dict[str, SitePlace],
    ended: float,
    interrupted: str,
    outcomes: dict[str, str | None] | None = None,
    late: str | None = None,
) -> dict[str, str]:
    """Every training attempt of a `streamflow run` in the site's cost.json (cost.py). A site on this
    machine records its own (a step ended from outside is closed here: at `ended`, as `interrupted`
    or late); a SLURM site's are its jobs of the round, found by their name (cwl.job_name) among
    those Slurm's controller still keeps, with Slurm's own times (a job still queued or running is
    being cancelled: it ends now). `outcomes`: the steps' own (None: finished). Returns the outcome
    recorded now for each site (its latest job's, for a SLURM site)."""
    from ....slurm.commands import job_state, named_jobs
    from ...rounds.failures import job_exit_text, late_job_reason
    from ...state.cost import end_running_attempts, record_attempt, slurm_attempt

    said: dict[str, str] = {}
    for w in work.train:
        place = places[w.name]
        path = w.directory / "cost.json"
        if place.services is None:
            outcome = f"late: running after {late}" if late else interrupted
            if end_running_attempts(path, ended, outcome):
                said[w.name] = outcome
            continue
        via = login_ssh_words(place.login, fed.streamflow.ssh_key) if place.login else []
        name = job_name(fed, work.number, w.name, "train")
        try:
            for job in sorted(named_jobs(name, via, ended=True), key=lambda j: int(j) if j.isdigit() else 0):
                state = job_state(job, via)
                running = not state.finished
                if running and late:
                    outcome = late_job_reason(state, late)
                elif running:
                    outcome = interrupted
                elif outcomes is not None and w.name in outcomes:
                    outcome = outcomes[w.name] or "finished"
                else:
                    done = w.receipt is not None and read_receipt(w.receipt) is not None
                    outcome = "finished" if done else f"failed: {job_exit_text(state)}"
                record_attempt(path, slurm_attempt(job, state, outcome, cancelled=running))
                said[w.name] = outcome
        except UserError as exc:  # its login node unreachable: the round goes on without these figures
            log.warning("%s: the times of its SLURM jobs could not be read, its node-hours are not recorded: %s",
                        w.label, exc)  # fmt: skip
    return said


def failure_reported(path: Path) -> str | None:
    """The reason a train step reported for its failed training (site_task.train, report_failure), or None."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    failed = data.get("failed") if isinstance(data, dict) else None
    return cut_reason(str(failed)) if failed else None
