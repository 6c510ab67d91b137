"""Slurm's own commands (sbatch, squeue, scontrol, scancel), each failure turned into one clear line."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UserError
from ..subprocesses import run_captured

__all__ = [
    "JobState",
    "submit_script",
    "job_state",
    "cancel_job",
    "requeue_job",
    "cancel_named",
    "named_jobs",
    "FINISHED_STATES",
]

FINISHED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


@dataclass(frozen=True)
class JobState:
    """What Slurm says about a job now."""

    job_id: str
    state: str
    """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN once Slurm has forgotten the job."""
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    restarts: int = 0
    exit_code: str = ""
    """Slurm's ExitCode, CODE:SIGNAL (e.g. 1:0), once the job has ended."""
    submit_time: str = ""
    """SubmitTime, StartTime, EndTime as scontrol prints them (local time, e.g. 2026-11-26T10:00:00; Unknown or None before)."""
    start_time: str = ""
    end_time: str = ""
    num_nodes: int = 0

    @property
    def finished(self) -> bool:
        # UNKNOWN: Slurm forgot the job (MinJobAge after its end), so it ended long ago.
        return self.state in FINISHED_STATES or self.state == "UNKNOWN"


def _check(result, what: str) -> str:
    if result.returncode == 127:
        raise UserError(f"{what}: Slurm's commands are not installed here; run on a login node of the cluster")
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise UserError(f"{what} failed: {message[-1] if message else f'exit code {result.returncode}'}")
    return result.stdout


def submit_script(script_path: str, workdir: str, options: tuple[str, ...] = ()) -> str:
    """sbatch a script (with sbatch `options` such as --dependency=afterok:ID); returns the job id."""
    out = _check(run_captured(["sbatch", "--parsable", f"--chdir={workdir}", *options, script_path]), "sbatch")
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise UserError(f"sbatch answered {out.strip()!r} instead of a job id")
    return job_id


def _job_id(job_id: str) -> str:
    """`job_id` when it is one: digits only. A word from a file must never reach a Slurm command as an
    option (`--me` given to scancel cancels every job of the user), so ids are checked here too, and
    passed after `--`, which ends the options of every Slurm command."""
    if not (isinstance(job_id, str) and job_id.isascii() and job_id.isdigit()):
        raise UserError(f"{job_id!r} is not a Slurm job id (digits); check where it came from")
    return job_id


def job_state(job_id: str, via: Sequence[str] = ()) -> JobState:
    """The job's state from scontrol (which also knows finished jobs for MinJobAge seconds); `via` as for
    cancel_named."""
    result = run_captured([*via, "scontrol", "--oneliner", "show", "job", "--", _job_id(job_id)])
    if result.returncode != 0 and "invalid job id" in (result.stderr + result.stdout).lower():
        return JobState(job_id, "UNKNOWN", reason="Slurm no longer knows this job")
    # Anything else (no Slurm here, no answer from the controller) is an error, not a job state.
    _check(result, f"scontrol show job {job_id}")
    fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
    state = fields.get("JobState", "UNKNOWN")
    if not re.fullmatch(r"[A-Z_]+", state):
        raise UserError(
            f"scontrol show job {job_id}: Slurm answered JobState={state!r}, not a job state; check Slurm with `scontrol ping`"
        )
    return JobState(
        job_id=job_id,
        state=state,
        reason=fields.get("Reason", ""),
        nodes=fields.get("NodeList", ""),
        elapsed=fields.get("RunTime", ""),
        restarts=_count(fields.get("Restarts", "0") or "0", f"scontrol show job {job_id}", "Restarts"),
        exit_code=fields.get("ExitCode", ""),
        submit_time=fields.get("SubmitTime", ""),
        start_time=fields.get("StartTime", ""),
        end_time=fields.get("EndTime", ""),
        num_nodes=int(fields["NumNodes"]) if fields.get("NumNodes", "").isdigit() else 0,
    )


def _count(text: str, what: str, name: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise UserError(f"{what}: Slurm answered {name}={text!r}, not a number; check Slurm with `scontrol ping`")
    return int(text)


def cancel_job(job_id: str) -> None:
    _check(run_captured(["scancel", "--", _job_id(job_id)]), f"scancel {job_id}")


def requeue_job(job_id: str) -> None:
    _check(run_captured(["scontrol", "requeue", "--", _job_id(job_id)]), f"scontrol requeue {job_id}")


def cancel_named(name: str, via: Sequence[str] = ()) -> None:
    """scancel every job named `name` that this user may cancel (give names unique to their work);
    `via` runs it elsewhere, e.g. ssh to a login node."""
    _check(run_captured([*via, "scancel", f"--name={name}"]), f"scancel --name={name}")


def named_jobs(name: str, via: Sequence[str] = (), ended: bool = False) -> list[str]:
    """Ids of the jobs named `name` that Slurm still lists (pending, running, completing; with `ended`, also
    those that ended less than MinJobAge ago, which the controller still keeps); `via` as for cancel_named."""
    states = ["--states=all"] if ended else []
    argv = [*via, "squeue", "--noheader", f"--name={name}", "--format=%i", *states]
    out = _check(run_captured(argv), f"squeue --name={name}")
    ids = [line.strip() for line in out.splitlines() if line.strip()]
    # the ids go on to scontrol and scancel: a line that is not one (a wrapper's banner, an array's
    # "12_[1-3]") is refused here, by the command that printed it
    for job_id in ids:
        if not (job_id.isascii() and job_id.isdigit()):
            raise UserError(
                f"squeue --name={name}: Slurm answered {job_id!r}, not a job id (digits); check Slurm with `squeue --me`"
            )
    return ids
