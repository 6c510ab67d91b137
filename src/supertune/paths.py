"""Where supertune keeps what it builds once and reuses: the embedded corpus, trained tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache root: $SUPERTUNE_CACHE, else $XDG_CACHE_HOME/supertune, else ~/.cache/supertune."""
    explicit = os.environ.get("SUPERTUNE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "supertune"
