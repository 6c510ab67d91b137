"""The last lines of a site's log, for the one message that says why its work failed."""

from __future__ import annotations

from pathlib import Path

__all__ = ["log_tail"]


def log_tail(logfile: Path, lines: int = 5) -> str:
    """ ": <the last non-empty lines> (whole log: PATH)", or " (log: PATH)" when there is nothing to show."""
    try:
        text = logfile.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    shown = [line for line in text if line.strip()][-lines:]
    return (":\n    " + "\n    ".join(shown) + f"\n  (whole log: {logfile})") if shown else f" (log: {logfile})"
