"""Shell text from values: quoting for the body of a job script, and safe forms for #SBATCH lines.

Every value that came from a user passes through one of these functions. Environment values may
refer to other variables ($NAME or ${NAME}); those references, and nothing else, stay live.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..errors import UserError

__all__ = ["Expand", "quote", "join", "env_value", "sbatch_value"]

_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Expand:
    """A word whose $NAME / ${NAME} references expand when the script runs (e.g. SLURM_NODEID on each
    node); everything else in it stays literal. Built by supertune itself, never from user values."""

    text: str


def quote(value: object) -> str:
    """One shell word that means exactly `value`."""
    return shlex.quote(str(value))


def join(words: list[object]) -> str:
    """A command line: literal words quoted, Expand words double-quoted with their references live."""
    return " ".join(env_value(w.text) if isinstance(w, Expand) else quote(w) for w in words)


def env_value(value: str) -> str:
    """A double-quoted shell word where $NAME / ${NAME} expand and nothing else does."""
    out, last = [], 0
    for match in _REFERENCE.finditer(value):
        out.append(_escape_double(value[last : match.start()]))
        out.append("${" + (match.group(1) or match.group(2)) + "}")
        last = match.end()
    out.append(_escape_double(value[last:]))
    return '"' + "".join(out) + '"'


def _escape_double(text: str) -> str:
    # Inside double quotes only \ " $ ` keep a meaning; escaping them leaves plain text.
    return re.sub(r'([\\"$`])', r"\\\1", text)


def sbatch_value(field: str, value: object) -> str:
    """A value for an #SBATCH line. sbatch reads such a line itself (no shell): it splits on blanks and
    strips one pair of quotes, with no escapes, so a value needs quotes only around blanks and can never
    hold a line break or both kinds of quote."""
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise UserError(f"{field}: {text!r} contains a line break, which a job script header cannot hold")
    if not re.search(r"[\s'\"#]", text):
        return text
    if '"' not in text:
        return f'"{text}"'
    if "'" not in text:
        return f"'{text}'"
    raise UserError(f"{field}: {text!r} holds both quote characters, which an #SBATCH line cannot express")
