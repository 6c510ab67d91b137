"""The one rule for a file that holds a site's secret (its noise key, its X25519 private key): it must
belong to the user reading it and be unreadable by anyone else, or it is refused in one line.

A secret another user owns may have been written, and can be read, by that user; one that the group or
others can read is no secret. Either way nothing it protects would hold, so nothing is done with it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...errors import UserError

__all__ = ["check_private_file", "read_private_file", "write_private_file"]


def check_private_file(path: Path, what: str, foreign_fix: str) -> None:
    """UserError when `path` (`what`: e.g. "privacy: the site's noise key") belongs to another user
    (`foreign_fix` says what to do) or is readable, writable or executable by its group or others."""
    st = path.stat()
    if st.st_uid != os.getuid():
        raise UserError(f"{what} {path} belongs to user {st.st_uid}, not to this one ({os.getuid()}); {foreign_fix}")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"{what} {path} is readable by others; chmod 600 {path}")


def read_private_file(path: Path, what: str, foreign_fix: str, size: int, damaged_fix: str) -> bytes:
    """The `size` bytes of the secret in `path`, after check_private_file; a file of another size is
    refused in one line (`damaged_fix` says what to do)."""
    check_private_file(path, what, foreign_fix)
    data = path.read_bytes()
    if len(data) != size:
        raise UserError(f"{what} {path} is {len(data)} bytes, not {size}; {damaged_fix}")
    return data


def write_private_file(path: Path, data: bytes, what: str) -> None:
    """Write `data` to a new file `path`, mode 0600 from its creation (never readable by others, not
    even for a moment); an existing file is refused in one line, never overwritten."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UserError(f"{what} {path} exists; it is never overwritten: give a new file, or use that key") from None
    except OSError as exc:
        raise UserError(f"{what} {path} cannot be written: {exc.strerror}") from None
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
