"""Reading a token store for training: shards memory-mapped with numpy (no copy, no load time).

A split is served as one logical token array (ShardedTokens) over its shards, which PackedBlocks
cuts into blocks exactly as it cuts the in-memory stream of a run from raw files. Pages are read
by the OS when a block is first touched, so start-up costs the checks in supertune.store.verify,
not the size of the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import DataConfig
from .manifest import Manifest, SplitEntry
from .verify import check_matches, check_store

__all__ = ["ShardedTokens", "StoreSplit", "TokenStore", "open_store", "open_store_for_run"]


class ShardedTokens:
    """Shards seen as one token array: len() and slicing, which is all PackedBlocks needs.

    A slice inside one shard is a view of its memory map; only a slice across a shard boundary is
    copied (one block per boundary).
    """

    def __init__(self, shards: list[np.ndarray]) -> None:
        self.shards = [s for s in shards if len(s)]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.dtype = self.shards[0].dtype if self.shards else np.dtype("<u2")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardedTokens supports contiguous slices only")
        start, stop, _ = key.indices(len(self))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        i = first
        while start < stop:
            offset = start - int(self.starts[i])
            take = min(stop, int(self.starts[i + 1])) - start
            pieces.append(self.shards[i][offset : offset + take])
            start += take
            i += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


@dataclass
class StoreSplit:
    tokens: ShardedTokens
    offsets: np.ndarray
    """Document i is tokens[offsets[i]:offsets[i + 1]]."""
    loss_mask: ShardedTokens | None = None
    """1 where a token is trained (conversations, prompt/completion rows), aligned with tokens; None: every token."""

    def masks(self) -> StoreSplit | None:
        """The loss masks as a sequence of documents (what padding mode indexes), or None."""
        return None if self.loss_mask is None else StoreSplit(self.loss_mask, self.offsets)

    def document(self, i: int) -> np.ndarray:
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]

    # Sequence of documents: what padding mode (data.packing=false) indexes, one document per item.
    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.document(i)

    def longest(self) -> int:
        """Tokens in the longest document (reads the offsets: 8 bytes per document)."""
        return int(np.diff(self.offsets).max()) if len(self) else 0


@dataclass
class TokenStore:
    directory: Path
    manifest: Manifest
    train: StoreSplit
    validation: StoreSplit


def _map_split(directory: Path, split: SplitEntry, dtype: str) -> StoreSplit:
    little = np.dtype(dtype).newbyteorder("<")
    shards = [np.memmap(directory / s.file, dtype=little, mode="r") for s in split.shards if s.tokens]
    offsets = np.memmap(directory / split.offsets.file, dtype="<i8", mode="r")
    masks = [np.memmap(directory / m.file, dtype=np.uint8, mode="r") for m in split.masks if m.tokens]
    return StoreSplit(ShardedTokens(shards), offsets, ShardedTokens(masks) if split.masks else None)


def open_store(directory: str | Path, hashes: bool = False) -> TokenStore:
    """Check a store (sizes always, sha256 when `hashes`) and memory-map its splits."""
    path = Path(directory).expanduser()
    manifest = check_store(path, hashes)
    return TokenStore(
        path,
        manifest,
        _map_split(path, manifest.splits["train"], manifest.dtype),
        _map_split(path, manifest.splits["validation"], manifest.dtype),
    )


# Above this many bytes, data.store_check=auto checks sizes only at training start. Hashing reads
# the whole store in every process of every node (about 1-2 GB/s per core from the page cache, far
# less from a network filesystem): seconds for 4 GiB, minutes for a 100 GB store read by 64 processes.
AUTO_HASH_BYTES = 4 << 30


def open_store_for_run(d: DataConfig, tokenizer: Any) -> TokenStore:
    """The store of data.store, refused unless it matches the run's tokenizer and data settings and
    every file has its recorded size and (as data.store_check says) sha256."""
    if d.store is None:
        raise ValueError("open_store_for_run needs data.store")
    path = Path(d.store).expanduser()
    manifest = check_store(path, hashes=False)
    check_matches(manifest, path, d, tokenizer)  # cheap refusals first
    size = sum(e.size for e, _ in manifest.files())
    return open_store(path, hashes=d.store_check == "sha256" or (d.store_check == "auto" and size <= AUTO_HASH_BYTES))
