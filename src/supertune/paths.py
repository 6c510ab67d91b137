"""Where supertune keeps what it builds once and reuses: the embedded corpus, trained tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UserError

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache root: $SUPERTUNE_CACHE, else $XDG_CACHE_HOME/supertune, else ~/.cache/supertune.

    A variable that names a file (or a path through one) is a UserError naming it: the cache is
    made lazily, deep inside a run, where the OSError would otherwise surface as a traceback."""
    explicit = os.environ.get("SUPERTUNE_CACHE")
    if explicit:
        return _directory_or_none_yet("SUPERTUNE_CACHE", explicit, Path(explicit).expanduser())
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return _directory_or_none_yet("XDG_CACHE_HOME", xdg, Path(xdg).expanduser()) / "supertune"
    return Path.home() / ".cache" / "supertune"


def _directory_or_none_yet(variable: str, value: str, path: Path) -> Path:
    """`path` when it is a directory or can become one (its nearest existing parent is a directory)."""
    existing = path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        found = "is a file" if existing == path else f"lies under the file {str(existing)!r}"
        raise UserError(f"{variable}={value!r}: {found}, not a directory; point it at a directory, or unset it")
    return path
