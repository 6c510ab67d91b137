"""Sizes in bytes as people write them on the command line and in configs, read one way everywhere.

- a single letter K, M, G, T is binary (1K = 1024), as Slurm's --mem and nccl-tests' -b/-e read it;
- KiB, MiB, GiB, TiB are binary too;
- KB, MB, GB, TB are decimal (1GB = 10^9), as transformers' max_shard_size reads it;
- a plain number is bytes. Case and a space before the unit do not matter; decimals are allowed
  ("1.5GB"), and the result is rounded down to whole bytes.
"""

from __future__ import annotations

import re

__all__ = ["parse_byte_size", "byte_size_problem"]

_UNITS = {
    "": 1, "B": 1,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_byte_size(text: str) -> int:
    """Bytes of `text` (see the module docstring); ValueError saying what is wrong otherwise."""
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write e.g. 64K, 1G (binary) or 5GB (decimal)")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return value


def byte_size_problem(text: str) -> str | None:
    """Why `text` is not a size, or None."""
    try:
        parse_byte_size(text)
    except ValueError as exc:
        return str(exc)
    return None
