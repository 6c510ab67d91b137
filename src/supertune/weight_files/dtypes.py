"""Tensor dtypes as safetensors names them, read and written with numpy.

numpy has no bfloat16, so bf16 is handled as its bits: widening is a 16-bit shift into a float32's
high half (exact), narrowing rounds to nearest even on the integer view, as torch and the hardware
do (a test compares every bit with torch's conversion). Using numpy rather than torch keeps an
average's start-up at a tenth of a second and its memory at a few tens of MB before any tensor.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = [
    "AVERAGED",
    "ITEM_SIZE",
    "OutputDtype",
    "OUTPUT_DTYPES",
    "accumulator_dtype",
    "narrow",
    "raw_numpy_dtype",
    "widen_into",
]

ITEM_SIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
"""Bytes per element of every safetensors dtype supertune can read."""

AVERAGED = frozenset({"F64", "F32", "F16", "BF16"})
"""Floating dtypes that are averaged; any other tensor must be identical in every input and is copied."""

OutputDtype = Literal["same", "bf16", "fp16", "fp32"]
OUTPUT_DTYPES: dict[str, str | None] = {"same": None, "bf16": "BF16", "fp16": "F16", "fp32": "F32"}
"""--dtype choice -> safetensors dtype of every averaged tensor (None: each tensor keeps its own)."""

_RAW = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "F8_E4M3": np.uint8,
    "F8_E5M2": np.uint8,
}


def raw_numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds a safetensors dtype's elements as stored (bf16 and fp8 as unsigned bits)."""
    return np.dtype(_RAW[dtype])


def accumulator_dtype(dtype: str) -> np.dtype:
    """Sums are kept in float32, or float64 for float64 tensors (which would lose bits in float32)."""
    return np.dtype(np.float64 if dtype == "F64" else np.float32)


def widen_into(raw: np.ndarray, dtype: str, out: np.ndarray) -> np.ndarray:
    """Write the values of `raw` (stored as `dtype`) into the float buffer `out`; returns `out`."""
    if dtype == "BF16":
        np.left_shift(raw, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, raw, casting="same_kind")
    return out


def narrow(acc: np.ndarray, dtype: str, scratch: np.ndarray, out16: np.ndarray) -> tuple[np.ndarray, bool]:
    """`acc` (float32 or float64) as `dtype`, and whether every value is still finite after the cast.

    `scratch` (uint32) and `out16` (uint16) are buffers at least as long as `acc`; the result of a
    16-bit cast is a view of `out16`. fp16 and bf16 round to nearest even; a value beyond the
    target's range becomes inf, which the caller refuses.
    """
    n = acc.size
    if dtype == "F32" or dtype == "F64":
        # `acc` is finite (checked before), and float32 sums are only ever written as float32
        return (acc if acc.dtype == raw_numpy_dtype(dtype) else acc.astype(raw_numpy_dtype(dtype))), True
    if dtype == "F16":
        out = out16[:n].view(np.float16)
        with np.errstate(over="ignore"):  # refused below, with the tensor's name
            np.copyto(out, acc, casting="same_kind")
        return out, bool(np.isfinite(out).all())
    if dtype == "BF16":
        bits = acc.astype(np.float32, copy=False).view(np.uint32)
        t = scratch[:n]
        # round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the low 16 bits
        np.right_shift(bits, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        np.add(t, 0x7FFF, out=t)
        np.add(t, bits, out=t)
        np.right_shift(t, 16, out=t)
        out = out16[:n]
        np.copyto(out, t, casting="unsafe")
        exponent_all_ones = np.bitwise_and(out, 0x7F80) == 0x7F80
        return out, not bool(exponent_all_ones.any())
    raise ValueError(f"cannot write averaged values as {dtype}")
