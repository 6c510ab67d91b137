"""What the GPU checklist runs on: carried wheels installed, the child processes' environment, and
the facts the report opens with (GPU, driver, package versions).

A lent GPU machine has a CUDA PyTorch and most of the field's packages but not `datasets`,
`python-hostlist` or `deepspeed`, and its `transformers` may be older than the one supertune pins.
`bench/gpu_wheels.sh` gathers the pinned wheels here; `install_wheels` puts them into a private
target directory there (`--no-deps --no-index`: nothing can be fetched on that machine, and the
torch already installed must stay), which the children find first on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors",
    "peft",
    "deepspeed",
    "pyarrow",
)


def install_wheels(wheels: Path, target: Path) -> str:
    """Install every wheel in `wheels` into `target`; returns pip's last lines for the report."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(
            f"bench/gpu.py: error: --wheels {wheels}: no .whl files there (make them with bench/gpu_wheels.sh)"
        )
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    argv += ["--target", str(target), *map(str, found)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench/gpu.py: error: installing the wheels failed: {done.stderr.strip()[-400:]}")
    return f"{len(found)} wheels from {wheels} installed into {target}"


def child_environment(site: Path | None, work: Path, dry_run: bool) -> dict[str, str]:
    """Environment of every run: the carried packages and the tree's own source first, offline hub,
    caches inside the work directory (a bare machine's home may be read-only or small)."""
    env = dict(os.environ)
    paths = [str(site)] if site else []
    paths.append(str(REPO / "src"))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.setdefault("HF_HOME", str(work / "hf-home"))
    env.setdefault("TRITON_CACHE_DIR", str(work / "triton-cache"))
    if dry_run:
        # One thread per process. The dry run's children run one at a time, but its test shares the
        # test machine's two cores with another pytest worker: at two threads each, the threads spun
        # against the other worker's processes (the dry run took 189 CPU-s at two, 132 at one).
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    for name in ("SUPERTUNE_FAULT", "SUPERTUNE_FAULT_ONCE"):
        env.pop(name, None)
    return env


def describe(env: dict[str, str]) -> dict[str, object]:
    """GPU, driver and package versions as the child processes see them (one short python child)."""
    probe = (
        "import json, importlib.metadata as m, torch\n"
        f"names = {PACKAGES!r}\n"
        "v = {}\n"
        "for n in names:\n"
        "    try: v[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: v[n] = None\n"
        "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None\n"
        "print(json.dumps({'versions': v, 'gpu': gpu, 'cuda': torch.version.cuda,\n"
        "    'gpus': torch.cuda.device_count(), 'torch_file': torch.__file__}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    facts: dict[str, object] = {"python": platform.python_version(), "host_cpus": os.cpu_count()}
    if done.returncode == 0:
        facts.update(json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        facts["probe_error"] = done.stderr.strip()[-500:]
    smi = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        if _has("nvidia-smi")
        else None
    )
    facts["nvidia_smi"] = smi.stdout.strip() if smi and smi.returncode == 0 else None
    return facts


def _has(program: str) -> bool:
    return any((Path(p) / program).is_file() for p in os.environ.get("PATH", "").split(os.pathsep) if p)
