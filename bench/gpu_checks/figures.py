"""What the checks read from a finished run to make a row's figures: saved files, logs, summaries.
Nothing here imports torch (a comparison of weights runs in a child)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from .runs import Done


def reload_matches(figures: dict[str, object]) -> bool:
    """The reloaded model's eval loss within 0.05 of the run's (bf16/fp16 output rounds the weights)."""
    difference = figures.get("|reload - run|")
    return isinstance(difference, float) and difference <= 0.05


def sharded_checkpoint(run_dir: Path) -> str | None:
    """The latest checkpoint's name when it holds FSDP's per-rank model shards (fsdp_model/), else None."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    return name if (run_dir / "checkpoints" / name / "fsdp_model").is_dir() else None


def throughput_figures(s: dict) -> dict[str, object]:
    return {
        "tokens/s": s.get("throughput_tokens_per_s"),
        "MFU": s.get("mfu"),
        "peak GPU memory GB": s.get("peak_device_memory_gb"),
        "train loss": s.get("train_loss"),
    }


PARAMETERS_LINE = re.compile(r"model ([0-9.]+)M parameters")


def logged_parameters(done: Done) -> int | None:
    """The parameter count the run logged (millions, two decimals), as an integer to compare."""
    text = done.log.read_text(encoding="utf-8", errors="replace") if done.log.exists() else ""
    found = PARAMETERS_LINE.findall(text)
    return int(round(float(found[-1]) * 1e6, -4)) if found else None


def importable(module: str, env: dict[str, str]) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


def saved_dtype(model_dir: Path) -> str | None:
    """The dtype of the first tensor of the saved model, read from the safetensors header."""
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                return entry["dtype"]
    return None


def max_weight_difference(a: Path, b: Path, env: dict[str, str]) -> float | str:
    """Largest absolute difference between two saved models, in a child (the parent need not import torch)."""
    probe = (
        "import sys, glob, torch\n"
        "from safetensors.torch import load_file\n"
        "def load(d):\n"
        "    out = {}\n"
        "    for p in sorted(glob.glob(d + '/*.safetensors')): out.update(load_file(p))\n"
        "    return out\n"
        "x, y = load(sys.argv[1]), load(sys.argv[2])\n"
        "assert x.keys() == y.keys(), 'different tensor names'\n"
        "print(max((x[k].float() - y[k].float()).abs().max().item() for k in x))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(a), str(b)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return "compare failed: " + done.stderr.strip()[-200:]
    return float(done.stdout.strip())


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def last_json(log: Path) -> dict:
    """The JSON object a `--json` command printed (the log also holds the command line)."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    start = text.find("\n{")
    if start < 0:
        return {}
    try:
        return json.loads(text[start + 1 :])
    except ValueError:
        return {}
