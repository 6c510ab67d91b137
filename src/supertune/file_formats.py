"""File formats supertune reads, by extension, and how their files are found."""

from __future__ import annotations

import glob
import os
from pathlib import Path

__all__ = ["FORMATS", "file_format", "expand_files"]

# extension -> the `datasets` builder that reads it
FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}


def file_format(path: str) -> str | None:
    """The datasets builder name for a file path (compressed .gz/.zst/.bz2/.xz files by their inner extension)."""
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".zst", ".bz2", ".xz"):
        suffixes = suffixes[:-1]
    return FORMATS.get(suffixes[-1]) if suffixes else None


def expand_files(patterns: list[str]) -> list[str]:
    """Expand paths and globs into sorted absolute file paths (each pattern's matches in order)."""
    out: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        matches = sorted(glob.glob(expanded, recursive=True)) if glob.has_magic(expanded) else [expanded]
        out += [os.path.abspath(m) for m in matches if os.path.isfile(m)]
    return out
