"""bench/gpu.py, the GPU checklist, runs on CPU in its dry-run form: the same checks with the tiny
model and a few steps, so that the script a rare GPU loan depends on cannot rot between loans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_the_dry_run_runs_every_check_and_writes_its_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--dry-run", "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "gpu-dry-run.json").read_text())
    rows = {(r["check"], r["variant"]): r for r in report["rows"]}
    statuses = {key: r["status"] for key, r in rows.items()}
    assert set(statuses.values()) <= {"ok", "not installed"}, statuses
    checks = {check for check, _ in rows}
    assert checks == {
        "embedded default",
        "FSDP --nproc 1",
        "throughput",
        "DeepSpeed",
        "kill and resume",
        "doctor",
        "attention",
    }

    fsdp = next(r for (check, _), r in rows.items() if check == "FSDP --nproc 1")["figures"]
    assert fsdp["mesh"] == {"dp_shard": 1} and fsdp["wrapper"].startswith("FSDP") and fsdp["saved dtype"] == "BF16"
    assert fsdp["sharded checkpoint"] == "checkpoint-4"
    resume = next(r for (check, _), r in rows.items() if check == "kill and resume")["figures"]
    assert (
        resume["killed exit"] == -9 and resume["resumed from"] == 2
    )  # the dry run: killed at step 3, a checkpoint every 2
    plain = rows[("throughput", "plain Trainer defaults (fp32)")]["figures"]
    supertune = rows[("throughput", "supertune: packing, bf16, sdpa, fused AdamW, training.speed=auto")]["figures"]
    assert plain["parameters"] == supertune["parameters"]
    assert supertune["speed-ups taken"] == "chunked_cross_entropy"  # the arm asks for adamw_torch_fused itself
    assert "supertune / this" in plain  # same model: the ratio is given
    md = (out / "gpu-dry-run.md").read_text()
    assert "## kill and resume" in md and "supertune train --run-dir RUN" in md


def test_an_unknown_check_is_one_line_before_anything_runs_or_is_written(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu.py"),
            "--dry-run",
            "--only",
            "fsdp-everything",
            "--out",
            str(out),
            "--work",
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1].startswith("bench/gpu.py: error: --only: no check named fsdp-everything")
    )
    assert not out.exists() and not work.exists()
