"""Integrity checks of a token store: sizes always, sha256 when asked, and the match with a run config.

Sizes cost one stat per file and catch a truncated copy. sha256 reads every byte (about 1-2 GB/s
per core, run on a few threads: a 10 GB store takes roughly 5-10 s on a node's local disk, longer on a
network filesystem) and catches a flipped byte; it runs at `supertune prepare --verify` and
before training starts, never per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import DataConfig
from ..errors import UserError
from ..file_table import sha256_files
from .manifest import Manifest, read_manifest, stored_rows, tokenizer_fingerprint

__all__ = ["check_store", "check_matches"]


def check_store(directory: Path, hashes: bool) -> Manifest:
    """The manifest of a sound store; a UserError naming the first bad file and the fix otherwise."""
    manifest = read_manifest(directory)
    for name, split in manifest.splits.items():
        if split.masks and [m.tokens for m in split.masks] != [sh.tokens for sh in split.shards]:
            _bad(directory, f"the {name} loss-mask shards do not hold the tokens of its id shards")
        if sum(sh.tokens for sh in split.shards) != split.tokens:
            _bad(
                directory,
                f"the {name} shards hold {sum(sh.tokens for sh in split.shards)} tokens, the manifest says {split.tokens}",
            )
    for entry, width in manifest.files():
        path = directory / entry.file
        if Path(entry.file).is_absolute() or ".." in Path(entry.file).parts:
            _bad(directory, f"{entry.file!r} is not a path inside the store")
        if not path.is_file():
            _bad(directory, f"{entry.file} is missing")
        size = path.stat().st_size
        if size != entry.size or size % width:
            _bad(directory, f"{entry.file} has {size} bytes, the manifest says {entry.size} (truncated or overwritten)")
        if hasattr(entry, "tokens") and entry.tokens * width != size:
            _bad(directory, f"{entry.file} has {size} bytes, not {entry.tokens} tokens of {width} bytes")
    for split in manifest.splits.values():
        if split.offsets.size != (split.documents + 1) * 8:
            _bad(directory, f"{split.offsets.file} should hold {split.documents + 1} offsets")
    if hashes:
        _check_hashes(directory, manifest)
        _check_offsets(directory, manifest)
    return manifest


def _check_hashes(directory: Path, manifest: Manifest) -> None:
    entries = [e for e, _ in manifest.files()]
    digests = sha256_files([directory / e.file for e in entries], max_threads=4)
    for entry, digest in zip(entries, digests):
        if digest != entry.sha256:
            _bad(
                directory,
                f"{entry.file} has sha256 {digest[:12]}..., the manifest says {entry.sha256[:12]}... (corrupted)",
            )


def _check_offsets(directory: Path, manifest: Manifest) -> None:
    """Offsets start at 0, never decrease, and end at the split's token count (reads 8 bytes per document)."""
    for name, split in manifest.splits.items():
        offsets = np.fromfile(directory / split.offsets.file, dtype="<i8")
        if offsets[0] != 0 or offsets[-1] != split.tokens or (np.diff(offsets) <= 0).any():
            _bad(directory, f"{split.offsets.file} does not describe {split.documents} documents of the {name} split")


def check_matches(manifest: Manifest, directory: Path, d: DataConfig, tokenizer: Any) -> None:
    """Refuse a store made with other settings than the run's, in one line that lists every difference."""
    diffs = []
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint != manifest.tokenizer.sha256:
        diffs.append(
            f"tokenizer sha256 {manifest.tokenizer.sha256[:12]}... ({manifest.tokenizer.name}), the run's is {fingerprint[:12]}..."
        )
    elif tokenizer.eos_token_id != manifest.tokenizer.eos_token_id or len(tokenizer) != manifest.tokenizer.vocab_size:
        diffs.append(
            f"EOS id {manifest.tokenizer.eos_token_id} and vocabulary {manifest.tokenizer.vocab_size}, "
            f"the run's are {tokenizer.eos_token_id} and {len(tokenizer)}"
        )
    for key in ("template", "text_field", "add_eos"):
        stored, wanted = getattr(manifest, key), getattr(d, key)
        if stored != wanted:
            diffs.append(f"data.{key}={stored!r}, the run's is {wanted!r}")
    rows, wanted_rows = manifest.rows or {"format": "text"}, stored_rows(d, tokenizer) or {"format": "text"}
    for key in sorted(set(rows) | set(wanted_rows)):
        if rows.get(key) != wanted_rows.get(key):
            name = "the chat template's sha256" if key == "chat_template_sha256" else f"data.{key}"
            diffs.append(f"{name}={rows.get(key)!r}, the run's is {wanted_rows.get(key)!r}")
    if diffs:
        raise UserError(
            f"data.store: {directory} was prepared with "
            + "; ".join(diffs)
            + "; run supertune prepare again with this run config, or use the store's settings"
        )


def _bad(directory: Path, reason: str) -> None:
    raise UserError(f"data.store: {directory}: {reason}; run supertune prepare again (or copy the store again)")
