"""Shell text from values: quoting for the body of a job script, and safe forms for #SBATCH lines.

Every value that came from a user passes through one of these functions. Environment values may
refer to other variables ($NAME or ${NAME}); those references, and nothing else, stay live.
"""

from __future__ import annotations

import re
import shlex

from ..config.job_values import one_line_problem
from ..errors import UserError
from ..launch.command_words import Expand

__all__ = ["Expand", "quote", "join", "env_value", "sbatch_value", "slurm_filename"]

_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# Characters sbatch's #SBATCH reader leaves alone outside quotes.
_SBATCH_PLAIN = re.compile(r"^[A-Za-z0-9_.,:=+@%/-]+\Z")


def quote(value: object) -> str:
    """One shell word that means exactly `value`."""
    return shlex.quote(_no_nul(str(value)))


def _no_nul(text: str) -> str:
    # bash drops a NUL byte of a script without a word, so the job would run another value.
    if "\0" in text:
        raise UserError(f"{text!r} holds a NUL byte, which a job script cannot carry; remove it where it was set")
    return text


def join(words: list[object]) -> str:
    """A command line: literal words quoted, Expand words double-quoted with their references live."""
    return " ".join(env_value(w.text) if isinstance(w, Expand) else quote(w) for w in words)


def env_value(value: str) -> str:
    """A double-quoted shell word where $NAME / ${NAME} expand and nothing else does."""
    _no_nul(value)
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
    """A value for an #SBATCH line, read back by sbatch exactly as given.

    sbatch reads such a line itself, not through a shell: a blank ends the value unless quoted, an
    unquoted # starts a comment, quotes are removed, and a backslash makes the next character plain
    (also inside quotes). So: plain text as is, anything else in double quotes with \\ and " escaped.
    A line break cannot be expressed at all.
    """
    text = str(value)
    problem = one_line_problem(text)
    if problem:
        raise UserError(f"{field}: {problem}")
    if _SBATCH_PLAIN.match(text):
        return text
    return '"' + re.sub(r'([\\"])', r"\\\1", text) + '"'


def slurm_filename(field: str, path: str) -> str:
    """`path` as the literal part of an --output/--error pattern: Slurm replaces %x, %j, ... there.

    %% stands for one %. A backslash anywhere switches every replacement off (and is dropped), so the
    log would not be named after the job: refused.
    """
    if "\\" in path:
        raise UserError(
            f"{field}: {path!r} contains a backslash, which Slurm's log file names cannot hold; choose another directory"
        )
    return path.replace("%", "%%")
