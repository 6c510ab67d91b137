"""scripts/env.sh --print: the PyTorch build chosen for each SUPERTUNE_TORCH value (and why), where the
venv goes, and the pip commands, with nothing downloaded; the CPU path (what CI installs) as before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def _print(repo: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if k not in ("SUPERTUNE_TORCH", "SUPERTUNE_VENV")}
    merged.update(env)
    return subprocess.run(["bash", str(repo / "scripts" / "env.sh"), "--print"], env=merged, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def _pip_torch(out: str) -> str:
    return next(line for line in out.splitlines() if "pip install torch==" in line)


@pytest.mark.parametrize("build", ["cu126", "cu128", "rocm6.4"])
def test_a_gpu_build_comes_from_pytorchs_index(repo: Path, tmp_path: Path, build: str) -> None:
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH=build, SUPERTUNE_VENV="/project/p123/supertune-venv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"supertune: PyTorch build {build} (SUPERTUNE_TORCH={build}); venv /project/p123/supertune-venv\n")
    assert _pip_torch(proc.stdout) == f"/project/p123/supertune-venv/bin/python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/{build}"
    # The other pins are the same for every build.
    assert f"/project/p123/supertune-venv/bin/python -m pip install -r {repo}/src/supertune/pinned-requirements.txt" in proc.stdout


def test_the_cpu_path_is_unchanged(repo: Path, tmp_path: Path) -> None:
    cases = [{"SUPERTUNE_TORCH": "cpu"}]
    if not Path("/dev/kfd").exists() and not Path("/usr/bin/nvidia-smi").exists():
        cases.append({"PATH": "/usr/bin:/bin"})  # auto, on a machine without a GPU driver (as CI's)
    for env in cases:
        proc = _print(repo, tmp_path, **env)
        assert proc.returncode == 0, proc.stderr
        assert _pip_torch(proc.stdout) == f"{repo}/.venv/bin/python -m pip install torch==2.13.0"


def test_auto_picks_cuda_where_nvidia_smi_lists_gpus(repo: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    proc = _print(repo, tmp_path, PATH=f"{fake.parent}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stderr
    assert "PyTorch build cu128 (auto: nvidia-smi lists NVIDIA GPUs" in proc.stdout
    assert _pip_torch(proc.stdout).endswith("--index-url https://download.pytorch.org/whl/cu128")


def test_a_wrong_build_name_is_one_line(repo: Path, tmp_path: Path) -> None:
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH="cuda12")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "supertune: SUPERTUNE_TORCH=cuda12 is not a PyTorch build; use cpu, cu126, cu128, rocm6.4 (a wheel index name) or auto"
