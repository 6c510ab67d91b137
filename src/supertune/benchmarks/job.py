"""`supertune eval MODEL --tasks ... --submit`: the benchmarks as a SLURM job of their own, on the
cluster of the model's run (or --cluster), one process on one node.

The job script is rendered by the training's renderer (`slurm.script.render_sbatch`: the profile's
modules, environment, container, partition and account, every value quoted), running the entry
point `bench-eval` instead of the training worker; the job writes the scores where `supertune eval
--tasks` would (`saved_model.scores_owner`), and keeps its script and logs in
`<that directory>/benchmarks-job/`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig
from ..entry import BENCH_EVAL
from ..errors import UserError
from ..rundir import RunDir, run_of_model
from ..slurm.job import JobSpec, job_spec
from .saved_model import scores_owner

__all__ = ["BENCHMARK_JOB_DIR", "BenchmarkJob", "benchmark_job", "plan_benchmark_job", "submit_benchmark_job"]

BENCHMARK_JOB_DIR = "benchmarks-job"


@dataclass(frozen=True)
class BenchmarkJob:
    """What `supertune eval --tasks` asks of the job: a pure value."""

    model: str
    """The model directory, absolute."""
    tasks: tuple[str, ...]
    limit: int | None
    batch_size: int
    verify: str


def benchmark_job(
    cfg: RunConfig, profile: ClusterProfile, directory: Path, bench: BenchmarkJob, python: str
) -> JobSpec:
    """The job of `bench` (pure): the run config's scheduler settings over the profile's, one process
    on one node with at most one GPU, never requeued (a rerun scores the model again)."""
    job = job_spec(cfg, profile, str(directory), python)
    gpus = min(job.gpus_per_node, 1)
    args = [bench.model, "--tasks", ",".join(bench.tasks), "--batch-size", str(bench.batch_size)]
    args += ["--verify", bench.verify] + (["--limit", str(bench.limit)] if bench.limit is not None else [])
    return dataclasses.replace(
        job,
        name=f"{cfg.output.name}-benchmarks",
        launcher="srun",
        nodes=1,
        procs_per_node=1,
        gpus_per_node=gpus,
        # The whole node's cores on a CPU node: the harness's forward passes use them all.
        cpus_per_proc=profile.cpus_per_gpu if gpus else max(1, profile.cpus_per_node),
        launcher_restarts=0,
        max_restarts=0,
        preflight=None,
        entry=BENCH_EVAL,
        entry_args=tuple(args),
    )


def plan_benchmark_job(
    bench: BenchmarkJob, cluster: str | None, time_limit: str | None
) -> tuple[JobSpec, ClusterProfile, RunDir]:
    """(the job, its cluster profile, the directory of its script and logs). The cluster and the
    scheduler settings are the model's run's (its config.yaml), --cluster and --time over them; a
    model outside a run needs --cluster."""
    from ..config import read_config_file
    from ..config.errors import ConfigError
    from ..config.validate import config_problems
    from ..resolve import resolve

    run = run_of_model(bench.model)
    if run is None and not cluster:
        raise UserError(
            f"--cluster: {bench.model} is not a run's model, so it has no cluster of its own: name one, "
            "e.g. --cluster leonardo (supertune clusters list)"
        )
    base = read_config_file(run.config) if run is not None else {}
    overrides = [f"launch.cluster={cluster}"] if cluster else []
    overrides += [f"slurm.time={time_limit}"] if time_limit else []
    # The run's files (data, model) are not read here: only its scheduler settings and the profile.
    resolution = resolve(None, overrides, base=base, base_name=f"run {run.path}" if run else "base", files_here=False)
    problems = config_problems(resolution.config)
    if problems:
        raise ConfigError(problems)
    if resolution.profile is None:  # not reached: resolve raises on a profile that does not load
        raise UserError(f"launch.cluster: no cluster profile {resolution.config.launch.cluster!r}")
    owner, _, _ = scores_owner(Path(bench.model))
    directory = RunDir(owner.path / BENCHMARK_JOB_DIR)
    job = benchmark_job(resolution.config, resolution.profile, directory.path, bench, sys.executable)
    return job, resolution.profile, directory


def submit_benchmark_job(script: str, directory: RunDir, cluster: str) -> str:
    """Write the script (the latest job's; every job's log stays, named by its id), submit it and
    record the job as `supertune submit` records a run's (slurm/jobs.py), so that status, logs and
    cancel read it alike."""
    from ..slurm.jobs import submit_job

    directory.logs.mkdir(parents=True, exist_ok=True)
    directory.job_script.write_text(script, encoding="utf-8")
    return submit_job(directory, cluster)
