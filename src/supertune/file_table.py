"""The file table every manifest holds: each file's path relative to its directory, its size in bytes
and its sha256. Checkpoints, saved models, token stores and averages all record one and check one.

Two spellings are on disk and stay so (manifests already written must keep reading): the token store
lists rows (`FileEntry`: {"file", "size", "sha256"}), checkpoints, models and averages map a path to
{"size", "sha256"} (`file_table`). Both are made and checked here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FileEntry", "sha256_file", "sha256_files", "size_and_sha256", "file_table", "table_problems"]


@dataclass
class FileEntry:
    """A file of a directory, relative to it."""

    file: str
    size: int
    """Bytes."""
    sha256: str

    @classmethod
    def of(cls, root: Path, path: Path) -> FileEntry:
        """The row of `path`, a file under `root` (reads the whole file)."""
        return cls(path.relative_to(root).as_posix(), path.stat().st_size, sha256_file(path))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file, read in 4 MiB chunks (about 1-2 GB/s per core; hashlib releases the GIL)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: Sequence[Path], max_threads: int = 8) -> list[str]:
    """sha256 of each file, in the given order, several files at a time in threads."""
    workers = max(1, min(max_threads, os.cpu_count() or 1, len(paths)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(sha256_file, paths))


def size_and_sha256(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """One value of a path -> {size, sha256} table; `sha256` when it is already known (else the file is read)."""
    return {"size": path.stat().st_size, "sha256": sha256 if sha256 is not None else sha256_file(path)}


def file_table(root: Path, leave_out: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under `root`, by path relative to it; files named in
    `leave_out` (the manifest that will hold the table) are left out.

    Hashing reads the whole directory once more (about 1 s per GB and thread); the files are hashed
    in parallel threads, since hashlib releases the GIL on large buffers.
    """
    left_out = set(leave_out)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in left_out)
    return {str(p.relative_to(root)): size_and_sha256(p, d) for p, d in zip(paths, sha256_files(paths))}


def table_problems(root: Path, files: dict[str, dict[str, Any]], hashes: bool) -> list[str]:
    """What is wrong with the files under `root` against a path -> {size, sha256} table (empty:
    nothing): missing files and sizes first (a stat each), then sha256 when `hashes` (reads everything)."""
    problems = []
    for rel, expected in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != expected["size"]:
            problems.append(f"{rel}: {size} bytes, manifest says {expected['size']}")
    if problems or not hashes:
        return problems
    names = sorted(files)
    digests = sha256_files([root / rel for rel in names])
    return [f"{rel}: sha256 differs from the manifest" for rel, d in zip(names, digests) if d != files[rel]["sha256"]]
