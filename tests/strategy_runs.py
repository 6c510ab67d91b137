"""Short two-process training runs that the sharding-strategy tests compare with one DDP run: the
settings they share, how one is started, and the DDP run itself (made once per test session, since
ZeRO's and FSDP's tests compare with the same run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

COMMON = [
    "training.max_steps=6",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "training.per_device_train_batch_size=8",
    "generate.max_new_tokens=4",
    # A quarter of the validation split: the final evaluation of the whole split (32k tokens) cost
    # ~4 CPU-s a run, and 64 sequences still compare the sharded evaluation with DDP's.
    "data.max_eval_samples=64",
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
    """The DDP run every strategy is compared with: (run dir, losses, summary). Its last step is saved
    as a checkpoint too (a DDP checkpoint, for the tests that need one)."""
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    losses, summary = train_run(run_dir, "training.save_strategy=steps", "training.save_steps=6")
    assert summary["sharding"]["wrapper"] == "DistributedDataParallel"
    return run_dir, losses, summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(run_dir: Path, fault: str | None = None) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents of 2 processes on this machine joined as 2 nodes (the launch environment
    sees 2 nodes x 2 local processes, as on two hosts), training the run directory's config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_FAULT")}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env["SUPERTUNE_FAULT"] = fault
    port = str(free_port())
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
            + ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port]
            + ["-m", "supertune.train.lifecycle.worker", str(run_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [a.communicate(timeout=600)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    return [subprocess.CompletedProcess(a.args, a.returncode, out, "") for a, out in zip(agents, outputs)]
