"""The pre-flight as a job step over the two emulated nodes of the test cluster (real sbatch and
srun, gloo across two network namespaces): it passes and lets the next step run, or stops the job
with the reason in the job log before training would start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cluster.slurm_cluster import SlurmCluster
from slurm_fixtures import TINY_JOB

SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000)) TORCH_CPP_LOG_LEVEL=ERROR OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 {python} -m supertune.entry doctor-worker --comm --min-size 16K --max-size 256K --repeats 3 \\
    --expect-gbps {expect} --out {report} || {{ echo "pre-flight failed: training not started"; exit 1; }}
echo "training starts"
"""


def _job(cluster: SlurmCluster, tmp_path: Path, name: str, expect: str) -> tuple[str, str, dict]:
    out, report = tmp_path / f"{name}.out", tmp_path / f"{name}.json"
    script = SCRIPT.format(python=sys.executable, expect=expect, report=report)
    job = cluster.sbatch(script, f"--output={out}", f"--chdir={tmp_path}")
    state = cluster.wait(job, timeout=180)
    return state, out.read_text(), json.loads(report.read_text()) if report.exists() else {}


def test_preflight_over_two_nodes_passes_or_stops_the_job(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    state, log, doc = _job(slurm_multi, tmp_path, "pass", "0.000001")
    assert state == "COMPLETED", log
    assert "training starts" in log and "(exit 0)" in log  # OK, or WARN (an empty offline hub cache, say)
    comm = doc["comm"]
    assert (comm["world_size"], comm["num_nodes"], comm["backend"], comm["error"]) == (2, 2, "gloo", None)
    assert doc["launcher"] == "slurm" and doc["host"] == "node1"
    for m in comm["measurements"]:
        factor = 1.0 if m["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n with n = 2
        assert abs(m["busbw_gbps"] - m["size_bytes"] / m["time_s"] / 1e9 * factor) <= 1e-9 * m["busbw_gbps"]

    state, log, doc = _job(slurm_multi, tmp_path, "fail", "1000000")
    assert state == "FAILED", log
    assert "below --expect-gbps 1e+06" in log and "pre-flight failed: training not started" in log
    assert "training starts" not in log
    assert doc["exit_code"] == 1 and doc["checks"][-1]["name"] == "comm" and doc["checks"][-1]["verdict"] == "fail"


TINY = [
    *TINY_JOB,
    "training.max_steps=4",
    "training.save_strategy=no",
    "slurm.preflight_max_size=1M",
]


def _preflight_job(
    slurm_multi: SlurmCluster, tmp_path: Path, launcher: str, name: str, gbps: str
) -> tuple[Path, str, str]:
    """A 2-node job of `launcher` whose pre-flight expects `gbps`: its run directory, state and log."""
    from slurm_fixtures import supertune

    config_dir = tmp_path / "config"
    (config_dir / "clusters").mkdir(parents=True, exist_ok=True)
    # The two emulated nodes share this machine's cores: one thread per process.
    (config_dir / "clusters" / "local.yaml").write_text('env:\n  OMP_NUM_THREADS: "1"\n', encoding="utf-8")
    env = dict(slurm_multi.env, SUPERTUNE_CONFIG_DIR=str(config_dir))
    run_dir = tmp_path / name
    proc = supertune("submit", "--cluster", "local", "--nodes", "2", "--launcher", launcher, *TINY,
                     "--run-dir", str(run_dir), "--expect-gbps", gbps, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout)
    state = slurm_multi.wait(job, timeout=300)
    return run_dir, state, _run_log(run_dir)


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_submit_preflight_runs_before_training(launcher: str, slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    passing, state, log = _preflight_job(slurm_multi, tmp_path, launcher, "passing", "0.000001")
    assert state == "COMPLETED", log[-4000:]
    report = json.loads((passing / "preflight.json").read_text())
    assert report["exit_code"] == 0 and report["comm"]["world_size"] == 2 and report["comm"]["num_nodes"] == 2
    assert log.index("supertune doctor: node1, rank 0 of 2") < log.index("supertune: rank 0 of 2")  # before training
    assert (passing / "summary.json").is_file()


def test_a_failed_preflight_stops_the_job_before_training(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    """Under srun, whose tasks are the training's own: the first step of the job fails and no task trains."""
    failing, state, log = _preflight_job(slurm_multi, tmp_path, "srun", "failing", "1000000")
    assert state == "FAILED", log[-4000:]
    assert "below --expect-gbps 1e+06" in log and "supertune: pre-flight failed: training not started" in log
    assert "supertune: rank 0 of 2" not in log and not (failing / "metrics.jsonl").exists()  # training never started
    assert json.loads((failing / "preflight.json").read_text())["exit_code"] == 1


def _run_log(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*")))
