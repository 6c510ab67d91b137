"""One masked upload of a secure sum as a file, and the sum of a round's uploads: what a site writes
and what the coordinator adds up (secure_sum.py for the integers, secure_masks.py for the masks).

A file is one line of JSON, the header, then each tensor's packed integers in the header's order:

    {"federation": ..., "round": R, "attempt": A, "phase": "scales" | "values", "site": ...,
     "sites": [the round's set, sorted], "bits": m, "tensors": [[name, count], ...]}

The masks already bind an upload to its federation, round, attempt and set (their keys are derived
from them): an upload of another round or attempt would not cancel, and the sum would be noise. The
header makes that a refusal instead: every upload is checked against what the sum expects before any
is added, and one that is for another round, attempt, phase, site or set stops the sum in one line,
with nothing added (a file left on the exchange from an earlier round, sent again, is refused, not
averaged).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from .secure_sum import packed_bytes, unpack_bits

__all__ = ["UploadHeader", "write_upload", "sum_uploads"]


@dataclass(frozen=True)
class UploadHeader:
    """What one masked upload is for."""

    federation: str
    round: int
    attempt: int
    phase: str
    site: str
    sites: tuple[str, ...]
    bits: int
    tensors: tuple[tuple[str, int], ...]

    def as_json(self) -> dict:
        data = asdict(self)
        data["sites"], data["tensors"] = list(self.sites), [list(t) for t in self.tensors]
        return data


def write_upload(path: Path, header: UploadHeader, packed: dict[str, np.ndarray]) -> None:
    """The header, then each tensor's packed integers (pack_bits at header.bits) in the header's order."""
    with open(path, "wb") as f:
        f.write(json.dumps(header.as_json()).encode() + b"\n")
        for name, count in header.tensors:
            data = packed[name]
            if data.nbytes != packed_bytes(count, header.bits):
                raise ValueError(
                    f"{name}: {data.nbytes} packed bytes, not those of {count} values of {header.bits} bits"
                )
            f.write(data.tobytes())


def _read(path: Path, label: str) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    line, _, body = raw.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        raise UserError(f"{label}: its masked upload {path} has no header; nothing is averaged") from None
    if not isinstance(header, dict):
        raise UserError(f"{label}: its masked upload {path} has no header; nothing is averaged")
    return header, body


def sum_uploads(expected: dict[str, UploadHeader], paths: dict[str, Path]) -> dict[str, np.ndarray]:
    """The sum mod 2^bits (uint32, per tensor) of every site's upload, each checked against the header
    `expected` for its site before any is added; UserError in one line naming the site otherwise."""
    bodies = {}
    for site, want in expected.items():
        label = f"{want.federation} round {want.round} attempt {want.attempt}: site {site}"
        header, body = _read(paths[site], label)
        for key in ("federation", "round", "attempt", "phase", "site", "sites", "bits", "tensors"):
            if header.get(key) != want.as_json()[key]:
                got = {k: header.get(k) for k in ("round", "attempt", "phase")}
                raise UserError(
                    f"{label}: its {want.phase} upload is for {key} {header.get(key)!r}, not {want.as_json()[key]!r} "
                    f"(round {got['round']}, attempt {got['attempt']}, {got['phase']}: a replay or a stale file); "
                    "nothing is averaged"
                )
        if len(body) != sum(packed_bytes(count, want.bits) for _, count in want.tensors):
            raise UserError(f"{label}: its {want.phase} upload is cut short or too long; nothing is averaged")
        bodies[site] = body
    totals: dict[str, np.ndarray] = {}
    for site, want in expected.items():
        offset = 0
        for name, count in want.tensors:
            size = packed_bytes(count, want.bits)
            values = unpack_bits(np.frombuffer(bodies[site], np.uint8, size, offset), want.bits, count)
            offset += size
            total = totals.get(name, np.zeros(count, np.uint64)).astype(np.uint64) + values.astype(np.uint64)
            totals[name] = total & np.uint64(2**want.bits - 1)
    return {name: total.astype(np.uint32) for name, total in totals.items()}
