"""Receipts: the record that a phase of a round is done, written atomically when it is, and read
back to know where a federation stands (no other state is kept)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..rundir import write_json_atomic

__all__ = ["write_receipt", "read_receipt"]


def write_receipt(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)


def read_receipt(path: Path) -> dict[str, Any] | None:
    """The receipt at `path`, or None when the phase has not finished."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable receipt ({exc}); delete it to redo that phase") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a receipt; delete it to redo that phase")
    return data
