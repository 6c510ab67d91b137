"""Reading a JSON-lines file that a process appends to (metrics.jsonl, a federation's failures.jsonl).

A process killed while appending leaves its last line cut short; readers take the records written
whole and leave that line (and any line that is not an object) out, rather than failing on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_records"]


def read_records(path: Path) -> list[dict[str, Any]]:
    """One dict per whole line of `path`, in order; [] when there is no file."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
