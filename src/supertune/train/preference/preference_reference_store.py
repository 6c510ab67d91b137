"""The precomputed reference log-probabilities kept in the run directory, so that a resumed or
requeued run reads them back instead of scoring every row with the start model again.

Two files in `<run dir>/reference/`: `logps.safetensors` (one rows x 2 float64 array per split, in
the order the run gives its splits: training, validation) and `reference.json`, the record of what
they were computed from: the start model's weights (sha256 over every tensor's name, dtype, shape
and bytes, so the same files and fresh weights of the same seed give the same digest, and anything
else does not), each split's rows (sha256 over the token ids and loss masks the log-probabilities
sum over), the settings that change the numbers (the rows a batch, which sets the padding, and the
device type), and the sha256 of the safetensors file. The numbers are written first, then the
record, each through a temporary file, an fsync and a rename (supertune.durable_files), so a record
always names a complete file.

A stored file is used only when its record matches what this start would compute from and its bytes
match the record; anything else (damaged bytes, other rows, another start model, other settings, an
unreadable record) is one log line saying which, and the numbers are computed and written again.
What the check costs: one read of the start model's weights for the digest (sha256 over each
tensor's own buffer, about 1.1 GB/s on one core: a 7B model in bf16 some 13 s; copied to the host
first where it lies on a GPU), against a forward pass over every row it replaces.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...durable_files import fsync_dir, replace_synced
from ...training_data.preference_data import PreferenceRows

__all__ = ["ReferenceRecord", "StoredReference", "model_digest", "rows_digest", "wanted_record"]

log = logging.getLogger("supertune")

VALUES_FILE = "logps.safetensors"
RECORD_FILE = "reference.json"
FORMAT = 1


@dataclass
class ReferenceRecord:
    """reference.json: what the stored log-probabilities were computed from."""

    model_sha256: str
    """The start model's weights (model_digest)."""
    rows: list[dict[str, Any]]
    """Each split, in order: its rows' count and sha256 (rows_digest)."""
    settings: dict[str, Any]
    """What else changes the numbers: the rows a batch (the padding) and the device type."""
    values_sha256: str = ""
    """sha256 of logps.safetensors, as written."""
    format: int = FORMAT
    what: str = field(default="reference log-probabilities of a preference run (rows x 2, float64, one array a split)")

    def differs_from(self, wanted: ReferenceRecord) -> str | None:
        """Why numbers recorded by `self` are not those `wanted` describes; None when they are."""
        if self.format != wanted.format:
            return f"they are of format {self.format}, this version writes {wanted.format}"
        if self.model_sha256 != wanted.model_sha256:
            return (
                f"they were computed from another start model (weights sha256 {self.model_sha256[:12]}, "
                f"now {wanted.model_sha256[:12]})"
            )
        for i, (had, now) in enumerate(zip(self.rows, wanted.rows)):
            if had != now:
                return f"they were computed from other rows of split {i} ({_rows_text(had)}, now {_rows_text(now)})"
        if len(self.rows) != len(wanted.rows):
            return f"they hold {len(self.rows)} splits, this run has {len(wanted.rows)}"
        if self.settings != wanted.settings:
            return f"they were computed with other settings ({_settings_text(self.settings)}, now {_settings_text(wanted.settings)})"
        return None


@dataclass(frozen=True)
class StoredReference:
    """Where a run keeps its precomputed reference log-probabilities, and whether this process writes them."""

    directory: Path
    writes: bool = True
    """The main process writes; every process reads (each computes what it cannot read)."""

    def read(self, wanted: ReferenceRecord) -> list[np.ndarray] | None:
        """The stored arrays when their record matches `wanted` and their bytes match the record;
        otherwise None, with one log line saying why (none when nothing was stored yet)."""
        record_path, values_path = self.directory / RECORD_FILE, self.directory / VALUES_FILE
        if not record_path.exists():
            return None
        try:
            record = ReferenceRecord(**json.loads(record_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as e:
            return self._not_used(f"{RECORD_FILE} cannot be read ({type(e).__name__}: {str(e).splitlines()[0]})")
        why = record.differs_from(wanted)
        if why:
            return self._not_used(why)
        try:
            raw = values_path.read_bytes()
        except OSError as e:
            return self._not_used(f"{VALUES_FILE} cannot be read ({e.strerror or e})")
        if hashlib.sha256(raw).hexdigest() != record.values_sha256:
            return self._not_used(f"{VALUES_FILE} is damaged (its sha256 differs from the one in {RECORD_FILE})")
        arrays = _arrays(raw, wanted)
        if arrays is None:
            return self._not_used(f"{VALUES_FILE} does not hold one rows x 2 array for each split of {RECORD_FILE}")
        return arrays

    def write(self, wanted: ReferenceRecord, arrays: Sequence[np.ndarray]) -> None:
        """The arrays, then their record naming the arrays' sha256; each file published whole."""
        if not self.writes:
            return
        from safetensors.numpy import save

        raw = save({f"split{i}": np.ascontiguousarray(a, dtype=np.float64) for i, a in enumerate(arrays)})
        self.directory.mkdir(parents=True, exist_ok=True)
        record = ReferenceRecord(**{**asdict(wanted), "values_sha256": hashlib.sha256(raw).hexdigest()})
        replace_synced(self.directory / VALUES_FILE, raw)
        replace_synced(self.directory / RECORD_FILE, (json.dumps(asdict(record), indent=2) + "\n").encode())
        fsync_dir(self.directory)

    def _not_used(self, why: str) -> None:
        log.warning("reference log-probabilities in %s not used: %s; computing them again", self.directory, why)
        return None


def wanted_record(model: Any, splits: Sequence[PreferenceRows], batch_size: int, device: Any) -> ReferenceRecord:
    """The record of the numbers this start computes: its start model, rows and settings."""
    return ReferenceRecord(
        model_sha256=model_digest(model),
        rows=[{"rows": len(rows), "sha256": rows_digest(rows)} for rows in splits],
        settings={"batch_size": int(batch_size), "device": str(getattr(device, "type", device))},
    )


def model_digest(model: Any) -> str:
    """sha256 over every tensor of the model's state dict: name, dtype, shape and bytes, in order."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1).contiguous()
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).cpu().numpy())  # the buffer itself: no copy of its bytes
    return digest.hexdigest()


def rows_digest(rows: PreferenceRows) -> str:
    """sha256 over every row's answers (the chosen and rejected, or the answer and its KL row):
    their token ids and the loss mask that says which of them the log-probability sums."""
    digest = hashlib.sha256()
    for answers in (rows.first, rows.second):
        for a in answers:
            digest.update(np.int64(len(a.ids)).tobytes())
            digest.update(np.asarray(a.ids, dtype=np.int64).tobytes())
            digest.update(np.asarray(a.mask, dtype=np.int8).tobytes())
    return digest.hexdigest()


def _arrays(raw: bytes, wanted: ReferenceRecord) -> list[np.ndarray] | None:
    from safetensors.numpy import load

    try:
        stored = load(raw)
    except Exception:  # safetensors raises its own error type for a malformed header
        return None
    arrays = [stored.get(f"split{i}") for i in range(len(wanted.rows))]
    if any(a is None or a.shape != (split["rows"], 2) for a, split in zip(arrays, wanted.rows)):
        return None
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _rows_text(split: dict[str, Any]) -> str:
    return f"{split.get('rows')} rows, sha256 {str(split.get('sha256', ''))[:12]}"


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(settings.items()))
