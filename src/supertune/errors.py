"""User-facing errors: the CLI prints them as one line and exits 2; anything else is a bug."""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input or environment, with the fix in the message."""
