"""Short two-process training runs that the sharding-strategy tests compare with one DDP run: the
settings they share, how one is started, and the DDP run itself (made once per test session, since
ZeRO's and FSDP's tests compare with the same run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

COMMON = [
    "training.max_steps=6",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "training.per_device_train_batch_size=8",
    "generate.max_new_tokens=4",
]


def run_losses(run_dir):
    """(step -> logged loss, summary.json) of a finished run."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, json.loads((run_dir / "summary.json").read_text())


def train_run(run_dir, *args, nproc=2):
    """`supertune train --nproc N` with COMMON and `args`; its losses and summary."""
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), "--nproc", str(nproc), *COMMON, *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_losses(run_dir)


@pytest.fixture(scope="session")
def ddp(tmp_path_factory):
    """The DDP run every strategy is compared with: (run dir, losses, summary)."""
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    losses, summary = train_run(run_dir)
    assert summary["sharding"]["wrapper"] == "DistributedDataParallel"
    return run_dir, losses, summary
