"""A command-line override of a cluster profile's setting reaches the training processes of a real
SLURM job, and the same `submit` command again is the same run.

The shipped ibex profile makes fp16 mixed precision the site default (V100 nodes have no bf16). A
user file merged over it describes the test cluster's CPU node instead of Ibex's V100 nodes (no
GPUs, modules, container or constraint), as a user would for their own site; the profile's
run_config stays the shipped one. With fp16 re-applied inside the job, as it once was, this CPU
job would fail (fp16 mixed precision needs a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cluster.slurm_cluster import SlurmCluster
from slurm_fixtures import TINY_JOB, supertune

TEST_CLUSTER_IBEX = """\
gpu_vendor: none
gpu_model: ""
gpus_per_node: 0
gpu_memory_gb: 0
peak_bf16_tflops_per_gpu: 0
cpus_per_gpu: 1
cpus_per_node: 2
partition: null
modules: []
container: {runtime: none, base_image: null, binds: []}
env: {HF_HOME: null, TORCH_HOME: null, OMP_NUM_THREADS: null}
run_config:
  slurm: {extra_args: []}
"""

TINY = [
    *TINY_JOB,
    "training.save_strategy=no",
    "training.max_steps=6",
    "output.progress_seconds=0.2",
]


def test_an_override_of_the_profile_survives_a_real_job(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    profiles = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters"
    profiles.mkdir(parents=True)
    (profiles / "ibex.yaml").write_text(TEST_CLUSTER_IBEX)
    run_dir = tmp_path / "run"
    argv = [
        "submit",
        "--cluster",
        "ibex",
        "--launcher",
        "srun",
        "--run-dir",
        str(run_dir),
        "training.fp16=false",
        *TINY,
    ]

    proc = supertune(*argv, env=slurm_client, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout)
    assert slurm_single.wait(job, timeout=300) == "COMPLETED", _logs(run_dir)

    # The config every process of the job read, and what the Trainer trained with.
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["fp16"] is False
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mixed_precision"] == "no"
    assert json.loads((run_dir / "resolution.json").read_text())["profile"]["name"] == "ibex"

    # The job log: progress lines, no progress bar's carriage returns.
    log = _logs(run_dir)
    assert "supertune: progress: step 6/6 (100%), loss " in log
    assert "\r" not in log

    again = supertune(*argv, env=slurm_client, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "has already finished; nothing to resume" in again.stderr


def _logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*")))
