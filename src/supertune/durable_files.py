"""Getting files onto the disk before a rename publishes them: a checkpoint, an average or a store
that looks complete must be complete after a power cut too."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_file", "fsync_dir", "fsync_tree", "write_synced", "replace_synced"]


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """The directory's entries (a rename into it, a new file) reach the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is still atomic there
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file under `root`, then every directory: one fsync each (a few per checkpoint; DeepSpeed writes one per rank)."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fsync_file(path)
    for d in sorted({p.parent for p in root.rglob("*")} | {root}):
        fsync_dir(d)


def write_synced(path: Path, text: str) -> None:
    """Write text and fsync it before returning."""
    with path.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def replace_synced(path: Path, data: bytes) -> None:
    """Publish `data` as `path` whole: written to a temporary file beside it, fsynced, then renamed over
    it, so a reader sees the old file or the new one, never half of one (fsync the directory after)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
