"""A run's SLURM jobs: prepare the run directory, submit, and find the jobs and logs again later."""

from __future__ import annotations

import glob
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig
from ..errors import UserError, first_line
from ..launch.launchers import ACCELERATE_CONFIG, accelerate_config, get_launcher
from ..rundir import RunDir, holds_run
from ..state_records import DamagedFile, Field, read_utf8, record_damage
from .commands import submit_script
from .job import JobSpec, job_spec
from .script import container_words, render_sbatch

__all__ = ["JobRecord", "render_job", "prepare_job", "submit_job", "job_records", "find_run", "log_files"]


@dataclass(frozen=True)
class JobRecord:
    """One submission of a run."""

    job_id: str
    cluster: str
    submitted_at: float


def render_job(
    cfg: RunConfig, profile: ClusterProfile, run_dir: str, run_dir_field: str = "--run-dir"
) -> tuple[JobSpec, str]:
    """The job and its script for a run in `run_dir`, writing nothing: a run directory the script
    cannot hold fails here (UserError naming `run_dir_field`) before any directory exists."""
    job = job_spec(cfg, profile, run_dir, sys.executable)
    return job, render_sbatch(job, profile, run_dir_field)


def prepare_job(cfg: RunConfig, profile: ClusterProfile, run: RunDir) -> tuple[JobSpec, str]:
    """Render the job script into the run dir (and the launcher's own files); returns (spec, script)."""
    job, script = render_job(cfg, profile, str(run.path))
    run.logs.mkdir(exist_ok=True)
    run.job_script.write_text(script, encoding="utf-8")
    if ACCELERATE_CONFIG in get_launcher(job.launcher).needs:
        precision = "bf16" if cfg.training.bf16 else "fp16" if cfg.training.fp16 else "no"
        run.accelerate_config.write_text(
            accelerate_config(job.step_plan(container_words(profile)), precision), encoding="utf-8"
        )
    return job, script


def submit_job(run: RunDir, cluster: str) -> str:
    """sbatch the run's script and record the job id in the run dir."""
    job_id = submit_script(str(run.job_script), str(run.path))
    record = {"job_id": job_id, "cluster": cluster, "submitted_at": time.time()}
    with run.jobs.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return job_id


JOB_FIELDS = {"job_id": Field("digits"), "cluster": Field("str"), "submitted_at": Field("number")}
"""A line of jobs.jsonl, as submit_job writes it: nothing else (a job id that is not digits would
reach scancel, scontrol and a log file glob)."""


def job_records(run: RunDir) -> list[JobRecord]:
    """The run's jobs, oldest first; a damaged line is a DamagedFile naming it."""
    path = run.jobs
    fix = "remove that line (see its job with squeue --me), or the file when none of the run's jobs is queued"
    text = read_utf8(path, fix.replace("that line", "the damaged lines"))
    records = []
    for number, line in enumerate((text or "").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise DamagedFile(path, f"not JSON: {first_line(exc)}", fix, f"line {number}") from None
        damage = record_damage(record, JOB_FIELDS, extra=False)
        if damage:
            raise DamagedFile(path, damage, fix, f"line {number}")
        records.append(JobRecord(**record))
    return records


def find_run(ref: str, runs_root: str = "runs") -> RunDir:
    """A run directory from a path, or from a run name (or unique prefix) under runs_root."""
    path = Path(ref).expanduser()
    if holds_run(path):
        return RunDir(path.absolute())
    root = Path(runs_root)
    candidates = sorted(p for p in root.glob(f"{ref}*") if holds_run(p)) if root.is_dir() else []
    exact = [p for p in candidates if p.name == ref]
    if exact or len(candidates) == 1:
        return RunDir((exact or candidates)[0].absolute())
    if candidates:
        names = ", ".join(p.name for p in candidates[:5])
        raise UserError(f"RUN: {ref!r} matches several runs ({names}); give the whole name or the path")
    raise UserError(f"RUN: {ref!r} is not a run directory (no config.yaml) nor a run name under {str(root)!r}")


def log_files(run: RunDir, job_id: str) -> list[Path]:
    """The job's stdout and stderr files (named %x-%j.out/.err by the script header)."""
    logs = run.logs
    pattern = glob.escape(job_id)  # a job id is digits; escaped all the same, so it can never match another job's log
    return sorted(logs.glob(f"*-{pattern}.out")) + sorted(logs.glob(f"*-{pattern}.err"))
