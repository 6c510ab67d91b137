"""supertune's own state files read back (jobs.jsonl, metrics.jsonl, summary.json, sweep.json): each
record checked against the fields its writer puts there.

A full disk, a killed process or a hand edit can leave such a file damaged. Its readers check what
they read here, and a damage is one `DamagedFile` line naming the file, the record, how it is damaged
and what to do, never a traceback further on (a job id that is not digits reaching scancel, a step
that is missing in a plot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import UserError

__all__ = ["DamagedFile", "Field", "record_damage", "read_utf8"]

Kind = Literal["int", "number", "str", "digits", "list", "dict", "bool"]

_KIND_TEXT = {
    "int": "a whole number",
    "number": "a number",
    "str": "text",
    "digits": "a job id (digits)",
    "list": "a list",
    "dict": "an object",
    "bool": "true or false",
}


@dataclass(frozen=True)
class Field:
    """What one field of a record holds."""

    kind: Kind
    required: bool = True
    null: bool = False
    """Whether null stands for "not measured" (an MFU on a CPU)."""
    least: float | None = None
    """The smallest value a number may hold (a run has at least 1 process, no count is below 0)."""


class DamagedFile(UserError):
    """One of supertune's own files that does not hold what supertune wrote there."""

    def __init__(self, path: Path | str, how: str, fix: str, where: str = "") -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {where + ' ' if where else ''}is damaged ({how}); {fix}")


def read_utf8(path: Path, fix: str) -> str | None:
    """The text of `path`, None when there is no file; bytes that are not UTF-8 are a DamagedFile."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, f"not UTF-8 text at byte {exc.start}", fix) from None


def record_damage(record: Any, fields: Mapping[str, Field], extra: bool = True) -> str | None:
    """How `record` differs from an object with `fields` (in words), or None when it matches.
    extra=False: a field the writer never writes is damage too (a record of another program)."""
    if not isinstance(record, dict):
        return f"a JSON {_json_type(record)}, not an object"
    for name, field in fields.items():
        if name not in record:
            if field.required:
                return f"no {name}"
            continue
        value = record[name]
        if value is None and field.null:
            continue
        if not _holds(value, field.kind):
            return f"{name} is {_show(value)}, not {_KIND_TEXT[field.kind]}"
        if field.least is not None and value < field.least:
            return f"{name} is {_show(value)}, not {_KIND_TEXT[field.kind]} of at least {field.least:g}"
    if not extra:
        unknown = [str(k) for k in record if k not in fields]
        if unknown:
            return f"a field supertune does not write: {unknown[0]}"
    return None


def _holds(value: Any, kind: Kind) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float)) and (isinstance(value, int) or not math.isinf(value))
    if kind == "digits":
        return isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20
    return isinstance(value, {"str": str, "list": list, "dict": dict}[kind])


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}.get(type(value), "value")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
