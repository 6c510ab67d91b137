"""User-facing errors: the CLI prints them as one line and exits 2; anything else is a bug."""

from __future__ import annotations

__all__ = ["UserError", "first_line"]


class UserError(Exception):
    """A problem with the user's input or environment, with the fix in the message."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none (`OSError()`):
    what a one-line error quotes of a library's reason."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__
