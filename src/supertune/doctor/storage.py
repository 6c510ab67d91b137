"""Storage checks: the Hugging Face caches and offline flags, writable directories for runs,
caches and temporary files, and free space on their file systems.

Writability is tested by creating and removing a file, not by permission bits: root ignores the
bits, a read-only mount does not, and quotas or ACLs show only when a write is tried.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .result import CheckResult, fail, ok, warn

__all__ = [
    "HfPaths",
    "hf_paths",
    "is_true",
    "writable",
    "check_hf_cache",
    "check_offline",
    "check_scratch",
    "check_tmpdir",
    "check_free_space",
    "FAIL_FREE_BYTES",
]

FAIL_FREE_BYTES = 1 << 30
"""Below 1 GiB free not even a small model's checkpoint fits: fail."""

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean variables


@dataclass(frozen=True)
class HfPaths:
    """Where huggingface_hub, transformers and datasets keep their caches, and what said so."""

    home: Path
    hub: Path
    datasets: Path
    source: str
    """The variables that set them, or "defaults"."""


def hf_paths(env: Mapping[str, str], home_dir: Path) -> HfPaths:
    """The caches as huggingface_hub and datasets resolve them from these variables."""
    used = [
        k
        for k in ("HF_HOME", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE")
        if env.get(k)
    ]
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home_dir / ".cache"
    home = Path(env.get("HF_HOME") or base / "huggingface").expanduser()
    hub = Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or home / "hub").expanduser()
    datasets = Path(env.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    return HfPaths(home, hub, datasets, ", ".join(used) or "defaults")


def is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in _TRUE


def writable(path: Path) -> tuple[bool, str]:
    """(whether a file can be created in `path`, or in the directory that would hold it, and how that was found)."""
    target, note = path, ""
    while not target.exists():
        if target.parent == target:
            return False, "no existing parent directory"
        target = target.parent
        note = f"not created yet; {target} would hold it"
    if not target.is_dir():
        return False, f"{target} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".supertune-doctor-", dir=target)
    except OSError as exc:
        return False, f"{note + ', ' if note else ''}cannot create a file: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return True, note


def check_hf_cache(paths: HfPaths, offline: bool) -> CheckResult:
    """The hub and datasets caches: present, what they hold, writable."""
    name = "hf-cache"
    hub_state = _cache_state(paths.hub)
    data_ok, data_note = writable(paths.datasets)
    hub_ok, hub_note = writable(paths.hub)
    evidence = (
        f"from {paths.source}: hub cache {paths.hub}: {hub_state}, {'writable' if hub_ok else 'NOT writable'}"
        f"{' (' + hub_note + ')' if hub_note else ''}; datasets cache {paths.datasets}: {'writable' if data_ok else 'NOT writable'}"
        f"{' (' + data_note + ')' if data_note else ''}"
    )
    if offline and (not paths.hub.is_dir() or hub_state.startswith("no model")):
        return warn(
            name,
            f"{evidence}; offline, so a hub id in model.name_or_path cannot load (fine when it is a local directory)",
            f"download on a login node into the same cache: HF_HOME={paths.home} hf download MODEL_ID "
            "(on the cluster, set HF_HOME to that directory), or give a local directory",
        )
    if not hub_ok or not data_ok:
        return warn(
            name,
            f"{evidence}: cached models load, but downloads, tokenizer and dataset cache files cannot be written",
            "point HF_HOME (or HF_HUB_CACHE / HF_DATASETS_CACHE) at a writable directory on scratch",
        )
    return ok(name, evidence)


def check_offline(env: Mapping[str, str], in_job: bool) -> CheckResult:
    """Inside a job the hub should be off: compute nodes usually have no internet, and a lookup
    waits for network timeouts before it fails."""
    name = "hf-offline"
    flags = [k for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE") if k in env]
    shown = ", ".join(f"{k}={env[k]}" for k in flags) or "no offline flag set"
    if is_true(env.get("HF_HUB_OFFLINE")):
        return ok(name, f"{shown}: nothing is downloaded; hub ids load from the local cache")
    if in_job:
        return warn(
            name,
            f"{shown} inside a SLURM job: a hub id not in the cache is looked up online, which hangs on nodes without internet",
            "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 in the job (the cluster profiles do), after downloading on a login node",
        )
    return ok(name, f"{shown}: hub ids missing from the cache are downloaded")


def check_scratch(dirs: Sequence[tuple[str, Path]]) -> CheckResult:
    """Each directory a run writes to (run directory, supertune's cache, temporary files, scratch) takes a new file."""
    name = "scratch"
    lines, bad = [], []
    for label, path in dirs:
        good, note = writable(path)
        lines.append(f"{label} {path}: {'writable' if good else 'NOT writable'}{' (' + note + ')' if note else ''}")
        if not good:
            bad.append(f"{label} {path}")
    evidence = "; ".join(lines)
    if bad:
        return fail(
            name,
            evidence,
            f"make {', '.join(bad)} writable, or move it: --run-dir / output.runs_root for runs, SUPERTUNE_CACHE for the cache, "
            "TMPDIR for temporary files (read-only mounts and full quotas show here)",
        )
    return ok(name, evidence)


def check_tmpdir(env: Mapping[str, str]) -> CheckResult:
    """TMPDIR, when set, is a directory a file can be created in. Python's tempfile passes over one that
    is not without a word (to /tmp), but the programs a run starts do not: gcc, which Triton and
    DeepSpeed compile their kernels with, stops with "cannot create temporary file", and so do
    shell tools (mktemp) in a job script."""
    name = "tmpdir"
    value = env.get("TMPDIR")
    if not value:
        return ok(name, f"TMPDIR {'empty' if value == '' else 'unset'}: temporary files go to {tempfile.gettempdir()}")
    path = Path(value)
    if not path.exists():
        found = "does not exist"
    elif not path.is_dir():
        found = "is a file, not a directory"
    else:
        good, note = writable(path)
        if good:
            return ok(name, f"TMPDIR={value}: a writable directory")
        found = f"is not writable ({note})"
    return fail(
        name,
        f"TMPDIR={value!r} {found}: compilers (Triton's and DeepSpeed's kernel builds) and tools such as mktemp "
        "cannot create their temporary files there",
        "point TMPDIR at a writable directory (node-local scratch; mkdir -p it first), or unset it",
    )


def check_free_space(
    dirs: Sequence[tuple[str, Path]],
    min_free_bytes: int,
    usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage,
) -> CheckResult:
    """Free space on the file system of each directory: fail below 1 GiB, warn below min_free_bytes."""
    name = "free-space"
    seen: dict[int, list[str]] = {}
    free_of: dict[int, tuple[int, int, Path]] = {}
    for label, path in dirs:
        existing = _existing(path)
        if existing is None:
            continue
        device = existing.stat().st_dev
        seen.setdefault(device, []).append(label)
        if device not in free_of:
            total, _used, free = usage(existing)
            free_of[device] = (free, total, existing)
    lines, low, full = [], [], []
    for device, labels in seen.items():
        free, total, existing = free_of[device]
        lines.append(f"{', '.join(labels)} ({existing}): {_size(free)} free of {_size(total)}")
        if free < FAIL_FREE_BYTES:
            full.append(f"{', '.join(labels)} ({_size(free)} free)")
        elif free < min_free_bytes:
            low.append(f"{', '.join(labels)} ({_size(free)} free)")
    evidence = "; ".join(lines) or "no directory to measure"
    if full:
        return fail(
            name,
            f"{evidence}: less than {_size(FAIL_FREE_BYTES)} free for {', '.join(full)}",
            "free space there, or move the directory to a file system with room (project scratch)",
        )
    if low:
        return warn(
            name,
            f"{evidence}: below {_size(min_free_bytes)} for {', '.join(low)}",
            "checkpoints of a 7B model with its optimizer state take about 100 GB each: free space or move the run to scratch "
            "(--min-free-gb sets this threshold)",
        )
    return ok(name, evidence)


def _cache_state(hub: Path) -> str:
    if not hub.is_dir():
        return "missing"
    try:
        entries = [p.name for p in hub.iterdir()]
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    models = sum(1 for n in entries if n.startswith("models--"))
    datasets = sum(1 for n in entries if n.startswith("datasets--"))
    if not models:
        return f"no model, {datasets} dataset(s)"
    return f"{models} model(s), {datasets} dataset(s)"


def _existing(path: Path) -> Path | None:
    while not path.exists():
        if path.parent == path:
            return None
        path = path.parent
    return path


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
