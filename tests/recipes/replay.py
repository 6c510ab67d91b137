"""What the recipe replays share: CPU-scaled data, a site's profile adapted to the Slurm test cluster,
and reading a finished run back.

A recipe replay runs a centre's whole workflow through supertune on CPU, with the centre's own
cluster profile merged under a user file that describes the test cluster's nodes instead of the
site's GPU nodes, the way a user adapts a profile to their own machine (docs/clusters.md). Only
the hardware, scheduler names, modules and container are replaced; the launcher, environment and
run settings of the site stay as shipped.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from cluster.slurm_cluster import SlurmCluster

# The site's hardware becomes the test cluster's CPU node (2 cores), without modules or container:
# the test cluster has neither. OMP_NUM_THREADS 1: two processes share the node's two cores.
TEST_CLUSTER_NODE = {
    "gpu_vendor": "none", "gpu_model": "", "gpus_per_node": 0, "gpu_memory_gb": 0, "peak_bf16_tflops_per_gpu": 0,
    "cpus_per_gpu": 1, "cpus_per_node": 2, "memory_per_node_gb": None, "partition": None, "account": None, "qos": None,
    "module_use": [], "modules": [], "container": {"runtime": "none", "image": None, "binds": []},
    "env": {"HF_HOME": None, "TORCH_HOME": None, "OMP_NUM_THREADS": "1"},
}  # fmt: skip

# Small enough for a CPU and a few steps; every recipe adds its own settings.
TINY = ["generate.max_new_tokens=0", "training.report_to=[]", "training.logging_steps=1", "output.progress_seconds=1"]


def site_on_test_cluster(config_dir: Path, site: str, **more: Any) -> Path:
    """A user profile `site`.yaml over the shipped one that puts the site on the test cluster."""
    data = {**TEST_CLUSTER_NODE, **more}
    if "run_config" not in more:
        data["run_config"] = {"slurm": {"extra_args": []}}  # a site's --constraint (Ibex's v100) is no test node's
    path = config_dir / "clusters" / f"{site}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def client_env(base: dict[str, str], config_dir: Path) -> dict[str, str]:
    """A user's shell: their profile directory, and USER, which a login shell always has (site
    profiles name it in paths, e.g. LUMI's MIOpen cache; this test machine's environment may lack it)."""
    env = dict(base or os.environ)
    env["SUPERTUNE_CONFIG_DIR"] = str(config_dir)
    env.setdefault("USER", getpass.getuser())
    return env


def run_supertune(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The supertune CLI in a child process; fails the test with its output when it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"supertune {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def submit_and_wait(
    cluster: SlurmCluster, args: list[str], env: dict[str, str], cwd: Path, run_dir: Path, timeout: float = 420
) -> str:
    """`supertune submit ARGS --run-dir RUN_DIR`, then the job's end; returns its log (asserted COMPLETED)."""
    proc = run_supertune("submit", *args, "--run-dir", str(run_dir), env=env, cwd=cwd)
    job = int(proc.stdout.strip())
    state = cluster.wait(job, timeout=timeout)
    log = job_log(run_dir)
    assert state == "COMPLETED", f"job {job} {state}:\n{log[-5000:]}"
    assert "Traceback" not in log, log[-5000:]
    return log


def job_log(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*")))


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def saved_config(run_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def documents(n: int, split: str = "train") -> list[str]:
    """The first n documents of the embedded corpus's train or validation file (English-like, learnable)."""
    from supertune.embedded import default_corpus

    corpus = default_corpus()
    out = []
    with open(corpus.train if split == "train" else corpus.validation, encoding="utf-8") as f:
        for line in f:
            if len(out) == n:
                break
            out.append(json.loads(line)["text"])
    return out
