"""How the values of one tensor travel: in their own dtype, in 16 bits, or in 8 or 4 bits with a scale per block.

- `same`: each tensor in the dtype its checkpoint stores (lossless for a float32 model);
- `bf16`, `fp16`: rounded to nearest even, 2 bytes a value (fp16 keeps 3 more mantissa bits than
  bf16 and overflows beyond 65504, which a change between rounds never reaches);
- `int8`, `int4`: blockwise absmax quantisation. The flat tensor is cut into blocks of `block_size`
  values (the last one padded with zeros); a block keeps scale = max|x| / L as float32 (L = 127 for
  int8, 7 for int4) and each value as round(x / scale), an integer in [-L, L]. A value comes back
  within half its block's scale, so one large value costs precision only in its own block. int8
  costs 1 + 4 / block_size bytes a value (64: 1.0625, 53 % of a bf16 tensor); int4 stores two
  values a byte, (q + 8) in the low 4 bits for the even element and the high 4 bits for the odd
  one: 0.5 + 4 / block_size bytes (64: 0.5625, 28 % of bf16).

Values are encoded and decoded a slice at a time: a slice that starts on a block boundary encodes on
its own, and decoding elements [start, stop) reads only the blocks that hold them. Tensors that are
not floating point (counters, indices) travel as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..weight_files.dtypes import narrow, widen_into
from ..weight_files.shard_writer import PlannedTensor

__all__ = ["CODECS", "FLOAT_DTYPES", "SCALE_SUFFIX", "Codec", "encoded_bytes", "encoded_parts"]

CODECS: tuple[str, ...] = ("same", "bf16", "fp16", "int8", "int4")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
SCALE_SUFFIX = ":absmax_scale"
"""Blockwise codecs store a tensor's scales as `<tensor name>:absmax_scale` (no tensor name holds a ':')."""

_TARGET = {"bf16": "BF16", "fp16": "F16"}
_QUANTISED = {"int8": (127, 1, "I8"), "int4": (7, 2, "U8")}
"""codec -> (largest integer level, values per stored byte, stored dtype)."""


@dataclass(frozen=True)
class Codec:
    name: str
    block_size: int = 64

    @property
    def blockwise(self) -> bool:
        return self.name in _QUANTISED

    def stored_dtype(self, dtype: str) -> str:
        """The dtype a tensor stored as `dtype` travels in (blockwise: its values; the scales are F32)."""
        if dtype not in FLOAT_DTYPES or self.name == "same":
            return dtype
        return _QUANTISED[self.name][2] if self.blockwise else _TARGET[self.name]

    def lossless(self, dtype: str) -> bool:
        """Whether a float32 (float64) value computed for a tensor of `dtype` comes back exactly."""
        return dtype not in FLOAT_DTYPES or (self.name == "same" and dtype in ("F32", "F64"))

    def blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block_size)

    def stored_length(self, numel: int) -> int:
        """Stored elements of a float tensor of `numel` values (blockwise: whole blocks, packed)."""
        if not self.blockwise:
            return numel
        return self.blocks(numel) * self.block_size // _QUANTISED[self.name][1]

    def stored_range(self, start: int, stop: int) -> tuple[int, int, int]:
        """(first, last) stored elements that hold values [start, stop), and how many values precede
        `start` in them; blockwise: also the blocks are [first, last) * values-per-element / block_size."""
        if not self.blockwise:
            return start, stop, 0
        per = _QUANTISED[self.name][1]
        first, last = start // self.block_size, -(-stop // self.block_size)
        return first * self.block_size // per, last * self.block_size // per, start - first * self.block_size

    def slice_length(self, preferred: int) -> int:
        """A slice length near `preferred` that starts every slice on a block boundary."""
        return max(1, preferred // self.block_size) * self.block_size

    def encode(self, values: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(stored values, the values as they will be decoded) of a slice of a float tensor held as
        `dtype`; `values` is float32 (float64 for an F64 tensor) and starts on a block boundary."""
        if self.blockwise:
            return self._quantise(values)
        target = self.stored_dtype(dtype)
        n = values.size
        stored, _ = narrow(values, target, np.empty(n, np.uint32), np.empty(n, np.uint16))
        stored = np.array(stored, copy=True)  # narrow returns views on its scratch buffers
        return stored, widen_into(stored, target, np.empty(n, dtype=values.dtype))

    def _blocks_of(self, values: np.ndarray) -> np.ndarray:
        """The values as float32 rows of block_size, the last one padded with zeros."""
        n, size = values.size, self.block_size
        blocks = self.blocks(n)
        if blocks * size == n and values.dtype == np.float32:
            return values.reshape(blocks, size)
        padded = np.zeros(blocks * size, dtype=np.float32)
        padded[:n] = values
        return padded.reshape(blocks, size)

    def block_scales(self, values: np.ndarray) -> np.ndarray:
        """Blockwise: each block's scale, max|x| / L, as float32."""
        return (np.abs(self._blocks_of(values)).max(axis=1) / float(_QUANTISED[self.name][0])).astype(np.float32)

    def _quantise(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = self._blocks_of(values)
        scales = self.block_scales(values)
        safe = np.where(scales > 0, scales, np.float32(1.0))
        q = np.rint(rows / safe[:, None]).astype(np.int8)  # |x| / scale <= L: no clipping needed
        decoded = (q.astype(np.float32) * scales[:, None]).reshape(-1)[: values.size]
        return self._pack(q.reshape(-1)), decoded.astype(values.dtype, copy=False)

    def _pack(self, q: np.ndarray) -> np.ndarray:
        if self.name == "int8":
            return q
        u = (q + 8).astype(np.uint8)
        return u[0::2] | (u[1::2] << 4)

    def _unpack(self, stored: np.ndarray) -> np.ndarray:
        if self.name == "int8":
            return stored.astype(np.float32)
        out = np.empty(stored.size * 2, np.float32)
        out[0::2] = stored & 0x0F
        out[1::2] = stored >> 4
        return out - 8.0

    def decode_into(
        self, stored: np.ndarray, scales: np.ndarray | None, dtype: str, skip: int, out: np.ndarray
    ) -> np.ndarray:
        """Decode into `out` (float32/float64) the values that start `skip` values into `stored`
        (blockwise: `stored` holds whole blocks and `scales` their scales)."""
        n = out.size
        if self.blockwise:
            assert scales is not None
            rows = self._unpack(stored).reshape(-1, self.block_size) * scales[:, None]
            out[:] = rows.reshape(-1)[skip : skip + n]
            return out
        return widen_into(stored[skip : skip + n], self.stored_dtype(dtype), out)


def encoded_parts(codec: Codec, name: str, dtype: str, numel: int) -> list[PlannedTensor]:
    """The stored tensors of one source tensor, flat: its values, and a blockwise codec's scales."""
    if dtype not in FLOAT_DTYPES:
        return [PlannedTensor(name, dtype, (numel,))]
    values = PlannedTensor(name, codec.stored_dtype(dtype), (codec.stored_length(numel),))
    if codec.blockwise:
        return [PlannedTensor(name + SCALE_SUFFIX, "F32", (codec.blocks(numel),)), values]
    return [values]


def encoded_bytes(codec: Codec, tensors: list[tuple[str, int]]) -> int:
    """Bytes the codec stores for tensors given as (safetensors dtype, values), the file's header left out."""
    return sum(part.nbytes for dtype, numel in tensors for part in encoded_parts(codec, "", dtype, numel))
