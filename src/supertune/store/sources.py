"""The raw inputs a store names in its manifest: local files, or the cached Arrow files of a hub dataset."""

from __future__ import annotations

import os
from pathlib import Path

from ..config.schema import DataConfig
from ..data.formats import expand_files
from ..file_hashes import sha256_file
from .manifest import SourceFile

__all__ = ["source_files"]


def source_files(d: DataConfig) -> dict[str, list[SourceFile]]:
    """Per split, the files the documents are read from, by base name, size and sha256 (a full read of each)."""
    if d.dataset_name:
        return _hub_files(d)
    from ..data.sources import training_files, validation_files

    return {"train": _files(expand_files(training_files(d))), "validation": _files(expand_files(validation_files(d)))}


def _files(paths: list[str]) -> list[SourceFile]:
    return [SourceFile(os.path.basename(f), os.path.getsize(f), sha256_file(Path(f))) for f in paths]


def _hub_files(d: DataConfig) -> dict[str, list[SourceFile]]:
    """A cached hub dataset is its Arrow files in the datasets cache: those are hashed, per split
    (loading it again here costs nothing: the cache is memory-mapped)."""
    from ..data.sources import load_hub_dataset

    loaded = load_hub_dataset(d)
    out: dict[str, list[SourceFile]] = {}
    for split in ("train", "validation"):
        if split in loaded:
            out[split] = _files([c["filename"] for c in loaded[split].cache_files])
    return out
