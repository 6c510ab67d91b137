"""Reading safetensors weights tensor by tensor, memory-mapped, a slice of rows at a time.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
byte range) and the tensors' bytes. Each file is mapped once; a slice of a tensor is a numpy view
on the mapping (no copy), and the pages of a slice are given back (`MADV_DONTNEED`) once it has
been used. Mapped pages that were read count in a process's resident memory until given back (or
reclaimed under pressure), so without that an average of three 13 GB models would count up to 39 GB
as resident; with it, the resident part stays near one slice per input while the kernel's page
cache keeps whatever it likes.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from .dtypes import ITEM_SIZE, raw_numpy_dtype

__all__ = ["TensorEntry", "TensorFile", "WeightFiles", "read_header", "INDEX_SUFFIX"]

INDEX_SUFFIX = ".safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are in its file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    """Absolute byte offset in the file."""
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row_length(self) -> int:
        """Elements per row (the last dimension; 1 for scalars and vectors of length 0)."""
        return max(1, self.shape[-1]) if self.shape else 1


def read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """(tensors by name, the file's __metadata__) of a safetensors file; UserError naming the file when it is not one."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than 8 bytes")
            (length,) = struct.unpack("<Q", head)
            if length > min(_MAX_HEADER, size - 8):
                raise ValueError(f"header length {length} does not fit in the file")
            header = json.loads(f.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: not a safetensors file (the header is not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + length
    tensors = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(x) for x in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if dtype not in ITEM_SIZE:
            raise UserError(f"{path}: tensor {name!r} has dtype {dtype}, which supertune average cannot read")
        entry = TensorEntry(name, dtype, shape, data_start + int(begin), data_start + int(end))
        if entry.end - entry.begin != entry.numel * ITEM_SIZE[dtype] or entry.end > size or entry.begin < data_start:
            raise UserError(
                f"{path}: tensor {name!r}: its byte range does not match its shape and dtype or the file size (a truncated file?)"
            )
        tensors[name] = entry
    return tensors, metadata


class TensorFile:
    """One safetensors file, mapped read-only while open."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tensors, self.metadata = read_header(self.path)
        self._map: mmap.mmap | None = None

    def open(self) -> None:
        if self._map is None:
            with self.path.open("rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._map.madvise(mmap.MADV_SEQUENTIAL)

    def close(self) -> None:
        if self._map is not None:
            with contextlib.suppress(
                BufferError
            ):  # a view is still referenced (by a traceback): unmapped when collected
                self._map.close()
            self._map = None

    def rows(self, entry: TensorEntry, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of `entry`, flat, as a view on the mapping (dtype as stored)."""
        self.open()
        item = ITEM_SIZE[entry.dtype]
        return np.frombuffer(
            self._map, dtype=raw_numpy_dtype(entry.dtype), count=stop - start, offset=entry.begin + start * item
        )

    def release(self, entry: TensorEntry, start: int, stop: int) -> None:
        """Give back the resident pages of elements [start, stop): the page cache keeps them, this process does not."""
        if self._map is None:
            return
        item = ITEM_SIZE[entry.dtype]
        lo = (entry.begin + start * item) // _PAGE * _PAGE
        hi = min(len(self._map), -(-(entry.begin + stop * item) // _PAGE) * _PAGE)
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class WeightFiles:
    """The tensors of one model or adapter directory: a single safetensors file, or the shards of an index."""

    def __init__(self, directory: Path, file_name: str) -> None:
        """`file_name`: model.safetensors, adapter_model.safetensors, or an index such as model.safetensors.index.json."""
        self.directory = Path(directory)
        self.index: Path | None = None
        self.files: dict[str, TensorFile] = {}
        self.where: dict[str, tuple[TensorFile, TensorEntry]] = {}
        if file_name.endswith(INDEX_SUFFIX):
            self.index = self.directory / file_name
            self._read_index()
        else:
            tf = TensorFile(self.directory / file_name)
            self.files[file_name] = tf
            self.where = {name: (tf, entry) for name, entry in tf.tensors.items()}

    def _read_index(self) -> None:
        try:
            weight_map = json.loads(self.index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{self.index}: not a usable safetensors index ({exc})") from None
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard or not (self.directory / shard).is_file():
                raise UserError(f"{self.index}: names shard {shard!r}, which is not a file beside it")
            self.files[shard] = TensorFile(self.directory / shard)
        for name, shard in weight_map.items():
            tf = self.files[shard]
            if name not in tf.tensors:
                raise UserError(f"{self.index}: says {name!r} is in {shard}, which does not hold it")
            self.where[name] = (tf, tf.tensors[name])

    @property
    def paths(self) -> list[Path]:
        """Every file these weights are read from (the index first), for hashing."""
        return ([self.index] if self.index else []) + [tf.path for tf in self.files.values()]

    @property
    def total_bytes(self) -> int:
        return sum(entry.end - entry.begin for _, entry in self.where.values())

    def entry(self, name: str) -> TensorEntry:
        return self.where[name][1]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        tf, entry = self.where[name]
        return tf.rows(entry, start, stop)

    def release(self, name: str, start: int, stop: int) -> None:
        tf, entry = self.where[name]
        tf.release(entry, start, stop)

    def in_file_order(self) -> list[str]:
        """Tensor names in the order their bytes lie on disk (shard by shard), so reading is sequential."""
        return sorted(self.where, key=lambda n: (self.where[n][0].path.name, self.where[n][1].begin))

    def close(self) -> None:
        for tf in self.files.values():
            tf.close()
