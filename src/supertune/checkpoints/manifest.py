"""The manifest of a checkpoint: what it holds (step, tokens, data position) and every file's size
and sha256, written last into the checkpoint so that a checkpoint without one is incomplete.

A run's final model/ gets a manifest of its own (MODEL_MANIFEST_FILE: the files' sizes and sha256
alone), checked wherever a saved model is loaded: `eval`, `generate`, training from it, averaging.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..file_table import file_table, table_problems

__all__ = [
    "MANIFEST_FILE",
    "MODEL_MANIFEST_FILE",
    "FORMAT",
    "VERIFY_MODES",
    "CheckpointManifest",
    "file_digests",
    "write_manifest",
    "read_manifest",
    "check_files",
    "write_model_manifest",
    "model_manifest_size_problems",
    "verify_model_files",
]

MANIFEST_FILE = "supertune-checkpoint.json"
MODEL_MANIFEST_FILE = "supertune-model.json"
"""Sizes and sha256 of a saved model's files, written last into <run dir>/model."""
AVERAGE_MANIFEST = "supertune-average.json"
"""What `supertune average` writes into its output: its "files" are the same table as a model's."""
FORMAT = 1
MODEL_MANIFEST_NAMES = (MODEL_MANIFEST_FILE, AVERAGE_MANIFEST, MANIFEST_FILE)
"""The manifests a model directory may carry, in the order they are looked for: its own, an average's, a checkpoint's."""
VERIFY_MODES = ("auto", "sha256", "size", "none")
"""How a saved model is checked against its manifest: auto is sha256 up to AUTO_SHA256_BYTES, size above."""
AUTO_SHA256_BYTES = 4 << 30


@dataclass
class CheckpointManifest:
    """What a checkpoint is, and what it must contain."""

    step: int
    """Optimizer steps done when it was written."""
    tokens_seen: int
    """Input tokens (non-padding) the run had read."""
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
    loss_tokens: int | None = None
    """Tokens the loss was computed on up to this step (targets of the shifted labels that are not -100,
    over every process): fewer than tokens_seen by a token per sequence at least, and by the prompts
    under data.loss_on. None in a checkpoint written before they were counted."""

    @property
    def total_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


def file_digests(root: Path, manifest_name: str = MANIFEST_FILE) -> dict[str, dict[str, Any]]:
    """The file table of a checkpoint or saved model: every file under `root` but its manifest."""
    return file_table(root, leave_out=(manifest_name,))


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
        raise ValueError(
            f"{MANIFEST_FILE}: format {data.get('format') if isinstance(data, dict) else '?'} is not {FORMAT}"
        )
    known = set(CheckpointManifest.__dataclass_fields__)
    try:
        return CheckpointManifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise ValueError(f"{MANIFEST_FILE}: {exc}") from None


def check_files(root: Path, manifest: CheckpointManifest) -> list[str]:
    """What is wrong with the files of a checkpoint against its manifest (empty: nothing): sizes
    first, then sha256 (reads everything)."""
    return table_problems(root, manifest.files, hashes=True)


def write_model_manifest(root: Path) -> None:
    """Record the size and sha256 of every file of a saved model directory, written last and flushed."""
    record = {
        "format": FORMAT,
        "kind": "model",
        "files": file_digests(root, MODEL_MANIFEST_FILE),
        "created_unix": time.time(),
    }
    tmp = root / f".{MODEL_MANIFEST_FILE}.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MODEL_MANIFEST_FILE)


def _model_table(root: Path) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """(manifest name, {file: {size, sha256}}) of the first manifest a model directory has: its own,
    an average's or a checkpoint's; None when it has none (a model from elsewhere). ValueError when unreadable."""
    for name in MODEL_MANIFEST_NAMES:
        path = Path(root) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{name} is unreadable ({first_line(exc)})") from None
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and "size" in v and "sha256" in v for v in files.values()
        ):
            raise ValueError(f"{name} has no table of files with size and sha256")
        if any(Path(rel).is_absolute() or ".." in Path(rel).parts for rel in files):
            raise ValueError(f"{name} names a file outside the directory")
        return name, files
    return None


def model_manifest_size_problems(root: Path) -> list[str]:
    """Missing files and wrong sizes against a model directory's manifest: a few stat calls, no reading."""
    try:
        found = _model_table(root)
    except ValueError as exc:
        return [str(exc)]
    return [] if found is None else [f"{p} ({found[0]})" for p in table_problems(Path(root), found[1], hashes=False)]


def verify_model_files(root: Path, mode: str = "auto") -> tuple[list[str], str]:
    """(problems, what was checked) of a model directory against its manifest, by `mode` (VERIFY_MODES).

    sha256 reads every file once (about 1 s per GB and core, the files hashed in parallel); size
    compares sizes only and catches a truncated or missing file, not a changed byte.
    """
    if mode == "none":
        return [], "not verified (--no-verify)"
    try:
        found = _model_table(root)
    except ValueError as exc:
        return [str(exc)], "manifest unreadable"
    if found is None:
        return [], "no manifest to verify against"
    name, files = found
    total = sum(int(v["size"]) for v in files.values())
    hashes = mode == "sha256" or (mode == "auto" and total <= AUTO_SHA256_BYTES)
    problems = [f"{p} ({name})" for p in table_problems(Path(root), files, hashes)]
    return problems, f"{len(files)} files, {total / 1e6:.1f} MB, {'sha256' if hashes else 'sizes only'} against {name}"
