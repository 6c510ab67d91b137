"""sha256 of files: what token-store and checkpoint manifests record and check."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["sha256_file", "sha256_files"]


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
