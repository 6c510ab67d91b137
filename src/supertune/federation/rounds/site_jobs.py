"""The evaluation job of a SLURM site: one process on one node of the site's cluster, rendered by the
same job-script renderer as training (the profile's modules, environment, container, partition and
account), running the entry point `site-eval` instead of the training worker."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .loop import SiteWork

if TYPE_CHECKING:
    from ...clusters.schema import ClusterProfile
    from ...config.schema import RunConfig
    from ...slurm.job import JobSpec

__all__ = ["submit_evaluation", "evaluation_job"]


def submit_evaluation(w: SiteWork, model: Path) -> str:
    """Write the site's evaluation job script into its round folder and submit it; returns the job id."""
    from ...clusters import load_profile
    from ...config.load import load_saved_config
    from ...rundir import RunDir
    from ...slurm.commands import submit_script
    from ...slurm.script import render_sbatch

    assert w.receipt is not None
    cfg = load_saved_config(w.config)
    profile = load_profile(w.site.where, what=f"site {w.name}: where")
    directory = RunDir(w.directory / "evaluate")
    directory.logs.mkdir(parents=True, exist_ok=True)
    job = evaluation_job(
        cfg, profile, directory.path, f"{w.name}-eval-r{w.round:03d}", (str(w.config), str(model), str(w.receipt))
    )
    directory.job_script.write_text(render_sbatch(job, profile), encoding="utf-8")
    return submit_script(str(directory.job_script), str(directory.path))


def evaluation_job(
    cfg: RunConfig, profile: ClusterProfile, directory: Path, name: str, args: tuple[str, str, str]
) -> JobSpec:
    """The evaluation job of a site (one process on one node) from its run config and profile;
    `args` are site_eval's (SITE_CONFIG, MODEL_DIR, RECEIPT). Also rendered inside a StreamFlow job."""
    from ...entry import SITE_EVAL
    from ...slurm.job import job_spec

    job = job_spec(cfg, profile, str(directory), sys.executable)
    return dataclasses.replace(
        job,
        name=name,
        launcher="srun",
        nodes=1,
        procs_per_node=1,
        gpus_per_node=min(job.gpus_per_node, 1),
        launcher_restarts=0,
        max_restarts=0,
        preflight=None,
        entry=SITE_EVAL,
        entry_args=args,
    )
