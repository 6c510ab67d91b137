"""Writing safetensors files whose tensors are computed after the header is written.

Every output tensor's name, dtype and shape are known before its values, so each shard's header is
written first and the values are appended slice by slice as they are computed, hashed on the way:
no tensor is ever held whole. Tensors are laid out by element size, largest first, so every tensor
starts at an offset aligned to its element size, as loaders that map files expect.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dtypes import ITEM_SIZE

__all__ = ["PlannedTensor", "ShardWriter", "plan_shards", "shard_file_names"]


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: str
    """Output dtype (safetensors name)."""
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEM_SIZE[self.dtype]


def plan_shards(tensors: list[PlannedTensor], max_bytes: int) -> list[list[PlannedTensor]]:
    """Split tensors, in order, into shards of at most max_bytes (a larger tensor gets a shard of its own);
    inside each shard, larger elements first (stable) for alignment."""
    shards: list[list[PlannedTensor]] = []
    current: list[PlannedTensor] = []
    size = 0
    for t in tensors:
        if current and size + t.nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current or not shards:
        shards.append(current)
    return [sorted(shard, key=lambda t: -ITEM_SIZE[t.dtype]) for shard in shards]


def shard_file_names(count: int, stem: str = "model") -> list[str]:
    """model-00001-of-00003.safetensors, ... (the Hugging Face naming, which its loaders find through the index)."""
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


class ShardWriter:
    """One safetensors file: the header at once, then each planned tensor's bytes in plan order."""

    def __init__(self, path: Path, tensors: list[PlannedTensor], metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.tensors = tensors
        header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
        offset = 0
        for t in tensors:
            header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
        self.data_bytes = offset
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
        self._file = self.path.open("wb")
        self._sha = hashlib.sha256()
        self._written = 0
        self._put(len(text).to_bytes(8, "little") + text)
        self._header_bytes = 8 + len(text)

    def _put(self, data: bytes | np.ndarray) -> None:
        self._file.write(data)
        self._sha.update(data)

    def write(self, values: np.ndarray) -> None:
        """Append the next bytes of the current tensor (a contiguous array of its output dtype)."""
        values = np.ascontiguousarray(values)
        if self._written + values.nbytes > self.data_bytes:
            raise RuntimeError(f"{self.path}: more bytes than planned")
        self._put(values.view(np.uint8).reshape(-1))
        self._written += values.nbytes

    def finish(self) -> dict[str, object]:
        """Flush to disk and close; {"size", "sha256"} of the file."""
        if self._written != self.data_bytes:
            raise RuntimeError(f"{self.path}: {self._written} bytes written of {self.data_bytes} planned")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"size": self._header_bytes + self.data_bytes, "sha256": self._sha.hexdigest()}

    def abort(self) -> None:
        self._file.close()
