"""DeepSpeed ZeRO through real sbatch jobs, and the HF token never written anywhere.

On the single-node test cluster (2 processes): ZeRO-2 with the deepspeed launcher, ZeRO-3 with
torchrun (16-bit gathered save), ZeRO-2 with CPU offload under srun. Each completes, its losses
agree with a local DDP run at the same global batch within 1e-3, and the ZeRO-3 model reloads.
Every job and the local run get an HF token in their environment; no file they leave holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.slurm_cluster import SlurmCluster

COMMON = [
    "training.max_steps=6",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "generate.max_new_tokens=4",
    "model.config_overrides=num_hidden_layers=1",
    "training.per_device_train_batch_size=8",
    "data.max_eval_samples=64",
]
JOBS = {
    # this one also writes checkpoints, so that the token check covers the Trainer's saved state
    "zero2-deepspeed": [
        "--launcher",
        "deepspeed",
        "distributed.strategy=zero2",
        "training.save_strategy=steps",
        "training.save_steps=3",
    ],
    "zero3-torchrun": ["--launcher", "torchrun", "distributed.strategy=zero3"],
    "zero2-offload-srun": ["--launcher", "srun", "distributed.strategy=zero2", "distributed.offload=cpu"],
}
TOLERANCE = 1e-3  # the bound for ZeRO against DDP
TOKEN = "hf_SupertuneTestTokenDoNotLeak0123456789"


def _supertune(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supertune", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def zero_runs(slurm_single: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zero")
    (root / "config").mkdir()
    env = dict(slurm_single.env, HF_TOKEN=TOKEN, SUPERTUNE_CONFIG_DIR=str(root / "config"))
    jobs = {}
    for name, args in JOBS.items():
        proc = _supertune(
            "submit",
            "--cluster",
            "local",
            "--nodes",
            "1",
            "launch.procs_per_node=2",
            "--run-dir",
            str(root / name),
            *COMMON,
            *args,
            env=env,
            cwd=root,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        jobs[name] = int(proc.stdout.strip())
    local_env = dict(os.environ, HF_TOKEN=TOKEN, SUPERTUNE_CONFIG_DIR=str(root / "config"))
    local = _supertune("train", "--nproc", "2", "--run-dir", str(root / "ddp"), *COMMON, env=local_env, cwd=root)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    for name, job in jobs.items():
        state = slurm_single.wait(job, timeout=600)
        logs = "".join(p.read_text(errors="replace") for p in (root / name / "logs").glob("*"))
        assert state == "COMPLETED", f"{name}: {state}\n{logs[-4000:]}"
    return {"ddp": root / "ddp", **{name: root / name for name in JOBS}}


@pytest.mark.parametrize("name", list(JOBS))
def test_zero_job_matches_ddp(zero_runs, name):
    ddp, zero = _losses(zero_runs["ddp"]), _losses(zero_runs[name])
    assert sorted(ddp) == sorted(zero) and len(ddp) >= 6
    assert max(abs(ddp[s] - zero[s]) for s in ddp) <= TOLERANCE
    summary = json.loads((zero_runs[name] / "summary.json").read_text())
    ddp_summary = json.loads((zero_runs["ddp"] / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert abs(summary["eval_loss"] - ddp_summary["eval_loss"]) <= TOLERANCE


def test_zero3_gathered_model_reloads_with_its_eval_loss(zero_runs):
    run = zero_runs["zero3-torchrun"]
    weights = list((run / "model").glob("*.safetensors"))
    assert weights, "no full checkpoint was gathered"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "eval", str(run / "model")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = float(proc.stdout.split("eval loss ")[1].split()[0])
    assert abs(loss - json.loads((run / "summary.json").read_text())["eval_loss"]) <= 1e-5


def test_hf_token_is_never_written(zero_runs):
    leaks = []
    for run in zero_runs.values():
        for path in run.rglob("*"):
            if path.is_file() and TOKEN.encode() in path.read_bytes():
                leaks.append(str(path))
    assert leaks == []
