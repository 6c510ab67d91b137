"""Submitting `supertune prepare --submit`: the array of unfinished parts, then the merge after it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig
from ..errors import UserError
from .commands import submit_script
from .job import job_spec
from .prepare_script import PrepareJob, render_array_script, render_merge_script

__all__ = ["PreparePlan", "prepare_job", "render_prepare", "submit_prepare", "ARRAY_SCRIPT", "MERGE_SCRIPT"]

ARRAY_SCRIPT = "array.sbatch"
MERGE_SCRIPT = "merge.sbatch"
JOBS_FILE = "jobs.jsonl"


def prepare_job(
    cfg: RunConfig, profile: ClusterProfile, out: Path, work: Path, parts: int, cpus: int | None
) -> PrepareJob:
    """Scheduler settings as for a training job of this config (run config over profile); one node per task."""
    spec = job_spec(cfg, profile, str(work), sys.executable)
    return PrepareJob(
        name=f"prepare-{out.name}",
        work=str(work),
        out=str(out),
        parts=parts,
        cpus=cpus or max(1, profile.cpus_per_node),
        time=spec.time,
        partition=spec.partition,
        account=spec.account,
        qos=spec.qos,
        mem=spec.mem,
        extra_args=spec.extra_args,
        python=spec.python,
    )


PreparePlan = tuple[str | None, str]


def render_prepare(job: PrepareJob, profile: ClusterProfile, todo: Sequence[int]) -> PreparePlan:
    """(array script or None when every part is finished, merge script)."""
    return (render_array_script(job, profile, todo) if todo else None), render_merge_script(job, profile)


def submit_prepare(
    job: PrepareJob, scripts: PreparePlan, cluster: str, made: Path | None = None
) -> tuple[str | None, str]:
    """Write the scripts into the work directory and submit them; returns (array job id or None, merge job id).
    `made`: the topmost directory this call made for the work directory (itself or a parent): it
    goes when sbatch refuses the first job (nothing was submitted, nothing else knows it)."""
    work = Path(job.work)
    array_script, merge_script = scripts
    array_id = None
    try:
        if array_script is not None:
            (work / ARRAY_SCRIPT).write_text(array_script, encoding="utf-8")
            array_id = submit_script(str(work / ARRAY_SCRIPT), str(work))
        (work / MERGE_SCRIPT).write_text(merge_script, encoding="utf-8")
        options = (f"--dependency=afterok:{array_id}",) if array_id else ()
        merge_id = submit_script(str(work / MERGE_SCRIPT), str(work), options)
    except UserError:
        if made is not None and array_id is None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    with (work / JOBS_FILE).open("a", encoding="utf-8") as f:
        f.write(
            json.dumps(
                {"array_job_id": array_id, "merge_job_id": merge_id, "cluster": cluster, "submitted_at": time.time()}
            )
            + "\n"
        )
    return array_id, merge_id
