"""A training run given GPUs that its PyTorch build cannot see stops before anything is created,
with the fix, instead of training on the CPU for hours (here: a CPU build of torch and a faked
SLURM GPU allocation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_gpu_job_with_a_cpu_build_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_GPUS_ON_NODE="2")
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-visibility: job 77 has 2 GPU(s) on this node (SLURM_GPUS_ON_NODE=2)" in proc.stderr
    assert "a CPU build cannot use GPUs" in proc.stderr and "fix: install the build for the node's GPUs" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()


def test_the_worker_of_a_job_refuses_too(tmp_path: Path) -> None:
    """The processes of a job start from the run directory (the entry point train-worker), not from `train`."""
    run = tmp_path / "run"
    made = subprocess.run([sys.executable, "-m", "supertune", "submit", "--cluster", "local", "--run-dir", str(run), "--dry-run"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    env = dict(os.environ, SLURM_JOB_ID="78", SLURM_GPUS_ON_NODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "supertune.entry", "train-worker", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-visibility: job 78 has 1 GPU(s)" in proc.stderr and "Traceback" not in proc.stderr
