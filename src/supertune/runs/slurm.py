"""A run started as a SLURM job: the job script checked before anything exists, the run directory
made (or the unfinished run resumed), the script and the launcher's files prepared, the job
submitted and recorded in the run's jobs.jsonl. Two jobs must never train the same run directory
at once: while the run's last job is still in the queue, a new one is refused, or that job is
kept (`if_queued="keep"`, the federation's choice: it waits for it). No torch is imported here:
this runs on login nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..errors import UserError
from ..rundir import RunDir
from .run_dir_choice import RunDirChoice, choose_run_dir

if TYPE_CHECKING:
    from ..resolve.resolve import Resolution

__all__ = ["SlurmStart", "start_slurm", "prepare_slurm", "check_renders", "queued_job", "run_script_here"]

IfQueued = Literal["refuse", "keep"]


@dataclass(frozen=True)
class SlurmStart:
    """What starting a run on SLURM did."""

    choice: RunDirChoice
    """The run directory, and whether it was new, resumed or already finished (then nothing was done)."""
    script: str | None = None
    """The job script written into the run directory; None when nothing was written (finished, or a job kept)."""
    job_id: str | None = None
    """The job that trains the run: the one submitted, or the one kept in the queue; None for a dry run."""
    kept: bool = False
    """job_id is the run's earlier job, still in the queue (if_queued="keep"), not a new one."""

    @property
    def run(self) -> RunDir:
        return self.choice.run


def prepare_slurm(
    resolution: Resolution, run_dir: str | None, run_dir_field: str = "--run-dir", no_resume: bool = False
) -> tuple[RunDirChoice, str | None]:
    """The run directory with its job script (and the launcher's files) written, nothing submitted;
    the script is None when the run has finished."""
    from ..slurm.jobs import prepare_job

    choice = _checked_choice(resolution, run_dir, run_dir_field, no_resume)
    if choice.finished:
        return choice, None
    return choice, prepare_job(resolution.config, resolution.profile, choice.run)[1]


def start_slurm(
    resolution: Resolution,
    run_dir: str | None,
    run_dir_field: str = "--run-dir",
    no_resume: bool = False,
    dry_run: bool = False,
    if_queued: IfQueued = "refuse",
) -> SlurmStart:
    """Prepare the run (as prepare_slurm) and submit its job, unless `dry_run`. A resumed run whose
    last job is still queued or running is refused (UserError naming `run_dir_field`), or that job is kept."""
    from ..slurm.jobs import prepare_job, submit_job

    new_dir = not (run_dir and Path(run_dir).expanduser().exists())
    _check_submittable(resolution, dry_run)
    choice = _checked_choice(resolution, run_dir, run_dir_field, no_resume)
    if choice.finished:
        return SlurmStart(choice)
    if choice.resumed and not dry_run:
        queued = queued_job(choice.run)
        if queued is not None and if_queued == "keep":
            return SlurmStart(choice, job_id=queued[0], kept=True)
        if queued is not None:
            raise UserError(
                f"{run_dir_field}: job {queued[0]} of this run is still {queued[1]}; it resumes by itself "
                f"after a requeue (cancel it first with `supertune cancel {choice.run.path}` to submit anew)"
            )
    profile = resolution.profile
    script = prepare_job(resolution.config, profile, choice.run)[1]
    if dry_run:
        return SlurmStart(choice, script)
    try:
        job_id = submit_job(choice.run, profile.name)
    except UserError:
        if new_dir and not choice.resumed:
            _remove_unsubmitted(choice.run)
        raise
    return SlurmStart(choice, script, job_id)


def _check_submittable(resolution: Resolution, dry_run: bool) -> None:
    """What would stop the job only after its wait in the queue: refused before sbatch, a warning in a dry run."""
    import sys

    from .submit_checks import submit_problems

    problems = submit_problems(resolution.config, resolution.profile)
    if dry_run:
        for problem in problems:
            print(f"supertune: warning: a real submission would be refused: {problem}", file=sys.stderr)
    elif len(problems) == 1:
        raise UserError(problems[0])
    elif problems:
        raise UserError(
            f"{len(problems)} problems would stop the job after its wait in the queue:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )


def _remove_unsubmitted(run: RunDir) -> None:
    """A run directory this call made, whose job sbatch refused: nothing ran in it and nothing else
    knows it, so it goes (a directory that existed before, the user's, is left as it is)."""
    import shutil

    shutil.rmtree(run.path, ignore_errors=True)


def _checked_choice(resolution: Resolution, run_dir: str | None, run_dir_field: str, no_resume: bool) -> RunDirChoice:
    """The job script checked (nothing exists yet), then the run directory made or chosen."""
    check_renders(resolution, run_dir, run_dir_field)
    return choose_run_dir(run_dir, resolution, no_resume)


def check_renders(resolution: Resolution, run_dir: str | None, run_dir_field: str = "--run-dir") -> None:
    """Render the job script once before anything is created, so that a run directory it cannot hold
    (UserError naming `run_dir_field`) leaves no half-made run behind, and a sweep stops before its
    first job when one of its scales cannot run."""
    from ..slurm.jobs import render_job

    cfg = resolution.config
    # A default run dir gets its timestamp later: digits and '-' only, which change nothing about quoting.
    planned = run_dir or str(Path(cfg.output.runs_root) / f"{cfg.output.name}-00000000-000000")
    render_job(cfg, resolution.profile, str(Path(planned).expanduser().absolute()), run_dir_field)


def queued_job(run: RunDir) -> tuple[str, str] | None:
    """(job id, state) of the run's last job while Slurm has not finished it (pending, running,
    requeued, suspended: it may still write to the run); None otherwise."""
    from ..slurm.commands import job_state
    from ..slurm.jobs import job_records

    records = job_records(run)
    if not records:
        return None
    state = job_state(records[-1].job_id)
    return None if state.finished else (records[-1].job_id, state.state)


def run_script_here(script: Path, log: Path) -> int:
    """A job script run by bash inside the SLURM allocation this process is in (a StreamFlow step,
    whose job the allocation is: the caller checks that there is one), its output appended to `log`;
    its exit code. The script's processes die with this one."""
    from ..subprocesses import run_logged

    return run_logged(["bash", str(script)], log)
