"""Long runs on the real Slurm test cluster: a USR1 to the batch shell (as --signal sends before the
time limit) checkpoints an FSDP run's shards, requeues and resumes to the same result as an
uninterrupted run; and a real time limit does the same by itself (one process, DDP's path)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cluster.slurm_cluster import SlurmCluster, wait_for_text
from slurm_fixtures import TINY_JOB, supertune

pytestmark = pytest.mark.slow

TINY = [
    *TINY_JOB,
    "training.save_steps=100000",
]


def _submit(slurm_client: dict[str, str], cwd: Path, run_dir: Path, *overrides: str) -> int:
    proc = supertune(
        "submit", "--cluster", "local", "--run-dir", str(run_dir), *TINY, *overrides, env=slurm_client, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines()), default=0)


def _wait_until(condition, what: str, timeout: float, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s\n{cluster.log_tail()}")
        time.sleep(0.2)


def test_usr1_checkpoints_requeues_and_resumes_to_the_same_result(
    slurm_single: SlurmCluster, slurm_client, tmp_path: Path
) -> None:
    """Under FSDP (2 processes, full shard): the stop writes each rank's shards (a sharded checkpoint),
    and the requeued job reads them back. The DDP path of the same requeue is the time-limit test's."""
    run_dir = tmp_path / "run"
    settings = [
        "training.max_steps=60",
        "launch.launcher=torchrun",
        "launch.procs_per_node=2",
        "distributed.strategy=fsdp",
    ]
    job = _submit(slurm_client, tmp_path, run_dir, *settings)
    _wait_until(lambda: _steps_logged(run_dir) >= 5, "step 5", 240, slurm_single)
    slurm_single.scancel(job, "--batch", "--signal=USR1")

    _wait_until(lambda: (run_dir / "summary.json").exists(), "the requeued job's summary", 300, slurm_single)
    assert slurm_single.wait(job, timeout=60) == "COMPLETED"
    info = slurm_single.job_info(job)
    assert info["Restarts"] == "1", info
    log = (run_dir / "logs" / f"supertune-{job}.out").read_text() + (
        run_dir / "logs" / f"supertune-{job}.err"
    ).read_text()
    assert "USR1 received by the job script" in log
    assert f"requeueing job {job} (restart 1 of 20)" in log
    assert "restart 0" in log and "restart 1" in log  # one log, appended across both attempts
    stopped_at = int(log.split("stopped at step ")[1].split()[0])
    assert 5 <= stopped_at < 60
    assert f"resuming from checkpoint-{stopped_at}" in log
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}" / "fsdp_model").is_dir()  # the ranks' shards
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_steps"] == 60 and summary["resumed_from_step"] == stopped_at

    # The same run, never interrupted, on this machine with torchrun and two processes.
    local = tmp_path / "local"
    straight = supertune("train", "--run-dir", str(local), "--nproc", "2", *TINY, *settings, timeout=300)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    expected = json.loads((local / "summary.json").read_text())
    assert abs(summary["eval_loss"] - expected["eval_loss"]) <= 1e-5
    a, b = load_file(run_dir / "model" / "model.safetensors"), load_file(local / "model" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5

    rows = supertune("status", str(run_dir), env=slurm_client, cwd=tmp_path).stdout.splitlines()
    header, row = rows[0].split(), rows[1].split()
    assert row[header.index("RESTARTS")] == "1" and row[header.index("STATE")] == "COMPLETED"


def test_a_real_time_limit_signals_checkpoints_and_requeues(
    slurm_single: SlurmCluster, slurm_client, tmp_path: Path
) -> None:
    """slurm.time 2 minutes with a 60 s lead: SLURM itself sends USR1 before the limit."""
    run_dir = tmp_path / "run"
    job = _submit(
        slurm_client,
        tmp_path,
        run_dir,
        "training.max_steps=1000000",
        "slurm.time=00:02:00",
        "slurm.signal_lead=60",
        "launch.launcher=srun",
        "launch.procs_per_node=1",
    )
    out = run_dir / "logs" / f"supertune-{job}.out"
    err = run_dir / "logs" / f"supertune-{job}.err"
    text = wait_for_text(out, "requeueing job", timeout=200)
    assert "USR1 received by the job script" in text
    _wait_until(lambda: "restart 1" in out.read_text(), "the restarted attempt", 120, slurm_single)
    _wait_until(lambda: "resuming from checkpoint-" in err.read_text(), "the resume", 120, slurm_single)
    assert slurm_single.job_info(job)["Restarts"] == "1"
    assert slurm_single.job_state(job) == "RUNNING"  # requeued before the limit: never TIMEOUT
    slurm_single.scancel(job)
    slurm_single.wait(job, timeout=60)
