"""`--nproc 2` (real torchrun, gloo) follows the same loss curve as one process at the same global batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

COMMON = [
    "training.max_steps=12",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "generate.max_new_tokens=0",
    "training.report_to=[]",
]


def _run(run_dir, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), *COMMON, *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, json.loads((run_dir / "summary.json").read_text())


def test_two_processes_match_one_at_the_same_global_batch(tmp_path):
    one, one_summary = _run(tmp_path / "one", "training.per_device_train_batch_size=16")
    two, two_summary = _run(tmp_path / "two", "--nproc", "2", "training.per_device_train_batch_size=8")
    assert two_summary["world_size"] == 2 and one_summary["world_size"] == 1
    assert sorted(one) == sorted(two) and len(one) >= 12
    worst = max(abs(one[s] - two[s]) for s in one)
    assert worst <= 1e-4, (worst, one, two)
    assert one_summary["train_tokens"] == two_summary["train_tokens"]
    assert abs(one_summary["eval_loss"] - two_summary["eval_loss"]) <= 1e-4
