"""A CPU run's output is supertune's lines: no DeepSpeed accelerator warning (a run without DeepSpeed
does not import it), no DDP find_unused_parameters warning, no torchrun OMP banner, no raw Trainer dicts;
--verbose shows the libraries' lines and the Trainer's records again."""

from __future__ import annotations

import os
import subprocess
import sys

COMMON = [
    "training.max_steps=2",
    "data.max_eval_samples=16",
    "training.save_strategy=no",
    "generate.max_new_tokens=0",
    "training.report_to=[]",
]
NOISE = [
    "Setting accelerator to CPU",  # DeepSpeed's, when something imports it
    "find_unused_parameters",  # DDP's reducer
    "Setting OMP_NUM_THREADS environment variable",  # torchrun's banner
    "{'loss'",  # the Trainer's records printed as dicts
    "{'train_runtime'",
]


def _train(tmp_path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", *args, *COMMON],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_cpu_run_prints_supertunes_lines_and_verbose_shows_the_rest(tmp_path) -> None:
    quiet = _train(tmp_path, "--nproc", "2", "--run-dir", str(tmp_path / "two"))
    assert [n for n in NOISE if n in quiet] == [], quiet
    assert "supertune: eval loss" in quiet and "supertune: progress: step 2/2" in quiet
    verbose = _train(tmp_path, "--verbose", "--run-dir", str(tmp_path / "one"))
    assert "{'loss'" in verbose and "{'train_runtime'" in verbose, verbose
