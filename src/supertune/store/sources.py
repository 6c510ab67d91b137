"""The raw inputs a store names in its manifest: local files, or the cached Arrow files of a hub dataset."""

from __future__ import annotations

import os
from pathlib import Path

from ..config.schema import DataConfig
from ..errors import UserError
from ..file_formats import expand_files
from ..file_table import sha256_file
from .manifest import SourceFile

__all__ = ["hash_sources", "source_paths"]


def source_paths(d: DataConfig) -> dict[str, list[str]]:
    """Per split, the files the documents are read from (a hub dataset: its cached Arrow files)."""
    if d.dataset_name:
        return _hub_paths(d)
    from ..documents.sources import training_files, validation_files

    return {"train": expand_files(training_files(d)), "validation": expand_files(validation_files(d))}


def hash_sources(paths: dict[str, list[str]]) -> dict[str, list[SourceFile]]:
    """Each file by base name, size and sha256 (a full read of each)."""
    return {split: [_source(f) for f in files] for split, files in paths.items()}


def _source(path: str) -> SourceFile:
    try:
        return SourceFile(os.path.basename(path), os.path.getsize(path), sha256_file(Path(path)))
    except OSError as exc:
        raise UserError(
            f"data: cannot read {path!r} to record its sha256 in the store: {exc.strerror or exc}"
        ) from None


def _hub_paths(d: DataConfig) -> dict[str, list[str]]:
    """A cached hub dataset is its Arrow files in the datasets cache, per split (loading it again
    here costs nothing: the cache is memory-mapped)."""
    from ..documents.sources import load_hub_dataset, validation_split_name

    loaded = load_hub_dataset(d)
    chosen = validation_split_name(d, list(loaded))  # data.validation_split: the split training evaluates on
    splits = {"train": "train", **({"validation": chosen} if chosen else {})}
    return {
        name: [c["filename"] for c in loaded[split].cache_files] for name, split in splits.items() if split in loaded
    }
