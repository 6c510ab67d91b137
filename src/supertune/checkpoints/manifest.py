"""The manifest of a checkpoint: what it holds (step, tokens, data position) and every file's size
and sha256, written last into the checkpoint so that a checkpoint without one is incomplete."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..file_hashes import sha256_files

__all__ = ["MANIFEST_FILE", "FORMAT", "CheckpointManifest", "file_digests", "write_manifest", "read_manifest", "check_files"]

MANIFEST_FILE = "supertune-checkpoint.json"
FORMAT = 1


@dataclass
class CheckpointManifest:
    """What a checkpoint is, and what it must contain."""

    step: int
    """Optimizer steps done when it was written."""
    tokens_seen: int
    """Input tokens (non-padding) the run had trained on."""
    samples_seen: int
    """Sequences consumed: step x global batch, the position in the data order."""
    world_size: int
    global_batch: int
    epoch: float
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Path relative to the checkpoint -> {"size": bytes, "sha256": hex}."""
    format: int = FORMAT
    created_unix: float = field(default_factory=time.time)
    reason: str = "schedule"
    """Why it was written: schedule (save_steps), or the signal that asked the run to stop."""

    @property
    def total_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


def file_digests(root: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under `root` (the manifest itself excluded).

    Hashing reads the whole checkpoint once more (about 1 s per GB and thread); the files are
    hashed in parallel threads, since hashlib releases the GIL on large buffers.
    """
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    digests = sha256_files(paths)
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": d} for p, d in zip(paths, digests)}


def write_manifest(root: Path, manifest: CheckpointManifest) -> None:
    """Write the manifest into `root`, flushed to disk (it is what marks the checkpoint complete)."""
    path = root / MANIFEST_FILE
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_manifest(root: Path) -> CheckpointManifest:
    """The manifest of the checkpoint in `root`; ValueError saying why when there is no usable one."""
    path = root / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {MANIFEST_FILE} (the save did not finish)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{MANIFEST_FILE} unreadable: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{MANIFEST_FILE}: format {data.get('format') if isinstance(data, dict) else '?'} is not {FORMAT}")
    known = set(CheckpointManifest.__dataclass_fields__)
    try:
        return CheckpointManifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise ValueError(f"{MANIFEST_FILE}: {exc}") from None


def check_files(root: Path, manifest: CheckpointManifest) -> list[str]:
    """What is wrong with the files of a checkpoint against its manifest (empty: nothing): sizes
    first, then sha256 (reads everything)."""
    problems = []
    for rel, expected in sorted(manifest.files.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != expected["size"]:
            problems.append(f"{rel}: {size} bytes, manifest says {expected['size']}")
    if problems:
        return problems
    names = sorted(manifest.files)
    digests = sha256_files([root / rel for rel in names])
    return [f"{rel}: sha256 differs from the manifest" for rel, d in zip(names, digests) if d != manifest.files[rel]["sha256"]]
