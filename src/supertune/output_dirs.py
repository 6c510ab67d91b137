"""Directories the user names as outputs (`--run-dir`, `--out`, `--dir`, `--sweep-dir`, a runs root):
the one place that checks, makes, stages and publishes them.

supertune writes into such a directory only when it is new, empty, or recognisably its own of the
same kind (the caller says how: a run's config.yaml, a store's manifest, a marker file); anything
else is refused in one line naming the option and what was found there, before anything is written.
A regular file, a path under a file, a symbolic link (to a directory, dangling or in a loop) and a
file system that cannot be written are refused the same way.

It deletes only what it can prove it made: a staging directory it made in this process, or one
whose marker (written first thing into it) names this host and a process that is gone.

    <parent>/.<name>.partial-<pid>/         while writing; holds STAGING_MARKER (pid, host, target)
    <parent>/<name>/                        appears whole, by one rename, after every file is flushed

An output that is a file (`average --momentum-out`) is checked the same way (new, or supertune's own
file of the same kind to replace) and staged the same way: written inside such a staging directory
beside it, then renamed over the target (Staging.publish_files).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from .durable_files import fsync_dir
from .errors import UserError

__all__ = [
    "OWN_MARKER",
    "STAGING_MARKER",
    "Staging",
    "check_output_dir",
    "check_output_file",
    "make_output_dir",
    "marked_as",
]

STAGING_MARKER = ".supertune-staging.json"
"""In a staging directory: the pid and host of the process writing it, and the output it becomes."""
OWN_MARKER = ".supertune-output.json"
"""In an output whose files carry no identity of their own (container recipes, a report): its kind."""

Own = Callable[[Path], bool]


def marked_as(kind: str) -> Own:
    """A test of ownership by the marker make_output_dir(mark=True) writes: the directory is `kind`'s."""

    def own(path: Path) -> bool:
        try:
            return json.loads((path / OWN_MARKER).read_text(encoding="utf-8")).get("kind") == kind
        except (OSError, ValueError, AttributeError):
            return False

    return own


def check_output_dir(path: str | os.PathLike[str], option: str, what: str, own: Own | None = None) -> Path:
    """The absolute path of an output `option` names, when supertune may write there: new (creatable),
    empty, or holding supertune's own `what` (own(path) is True). Otherwise a UserError naming
    `option`, the path and what was found, with the way out. Nothing is created."""
    out = Path(path).expanduser().absolute()
    found = _obstacle(out)
    if found is None and out.is_dir():
        names = _entries(out)
        if names and not (own is not None and own(out)):
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            found = f"holds files supertune did not write ({shown}); supertune writes only into a new or empty directory or into its own {what}"
    if found is not None:
        way_out = "" if "; " in found else "; choose another path"
        raise UserError(f"{option}: {out} {found}{way_out}")
    return out


def check_output_file(path: str | os.PathLike[str], option: str, what: str, own: Own | None = None) -> Path:
    """The absolute path of an output file `option` names, when supertune may write it: new (its
    directory creatable), or a file holding supertune's own `what` (own(path) is True), which is
    replaced. Otherwise a UserError naming `option`, the path and what was found. Nothing is created."""
    out = Path(path).expanduser().absolute()
    if out.is_dir() and not out.is_symlink():
        found = f"is a directory; {option} names a file"
    elif out.is_file() and not out.is_symlink():
        mine = own is not None and own(out)
        found = None if mine else f"is a file supertune did not write (not its {what}); choose another path"
    else:
        found = _obstacle(out)
        if found is not None:
            found = found.replace("name the directory itself", "name the file itself")
        if found is not None and "; " not in found:
            found += "; choose another path"
    if found is not None:
        raise UserError(f"{option}: {out} {found}")
    return out


def make_output_dir(
    path: str | os.PathLike[str], option: str, what: str, own: Own | None = None, mark: str | None = None
) -> Path:
    """check_output_dir, then make the directory (with its parents); with `mark`, record it as
    supertune's `mark` (OWN_MARKER) so that a later run recognises it as its own."""
    out = check_output_dir(path, option, what, own)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if mark:
            (out / OWN_MARKER).write_text(json.dumps({"kind": mark}) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"{option}: cannot write {out}: {exc.strerror or exc}; choose a directory you can write"
        ) from None
    return out


class Staging:
    """Where an output is written before one rename publishes it as `out` (checked by check_output_dir).

    `replace` lets publish() swap out a directory that holds supertune's own output of this kind
    (moved aside, removed after the rename); otherwise `out` must be missing or empty then."""

    def __init__(self, out: Path, option: str, replace: bool = False) -> None:
        self.out = Path(out)
        self.option = option
        self.replace = replace
        self.path = self.out.parent / f".{self.out.name}.partial-{os.getpid()}"
        self.published = False
        self._made = False

    def __enter__(self) -> Staging:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
            self.path.mkdir()  # fails when it exists: never a directory this process did not make
            self._made = True
            marker = {"pid": os.getpid(), "host": socket.gethostname(), "target": str(self.out), "unix": time.time()}
            (self.path / STAGING_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        except OSError as exc:
            self.__exit__()
            raise UserError(
                f"{self.option}: cannot write beside {self.out}: {exc.strerror or exc}; choose a directory you can write"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._made and not self.published:
            shutil.rmtree(self.path, ignore_errors=True)

    def publish_files(self, targets: list[Path]) -> None:
        """Rename the staged files named like `targets` (in the staging directory) over them, then
        remove the staging directory: for an output that is a file, staged in a directory beside it."""
        for target in targets:
            os.replace(self.path / target.name, target)
        self.published = True
        fsync_dir(self.out.parent)
        shutil.rmtree(self.path, ignore_errors=True)

    def _remove_stale(self) -> None:
        """Remove what a killed writer of the same output left on this host; refuse while it still runs.
        A directory named like a staging one without supertune's marker, or from another host, is left alone."""
        host = socket.gethostname()
        for leftover in self.out.parent.glob(f".{self.out.name}.partial-*"):
            try:
                marker = json.loads((leftover / STAGING_MARKER).read_text(encoding="utf-8"))
                pid, its_host = int(marker["pid"]), str(marker["host"])
            except (OSError, ValueError, TypeError, KeyError):
                continue  # not provably supertune's: never deleted
            if its_host != host or pid == os.getpid():
                continue
            if _alive(pid):
                raise UserError(
                    f"{self.option}: process {pid} is writing {self.out} ({leftover}); wait for it, or remove that directory if it is gone"
                )
            shutil.rmtree(leftover, ignore_errors=True)

    def publish(self) -> None:
        """Flush the staging directory's entries and rename it to the output."""
        (self.path / STAGING_MARKER).unlink()
        fsync_dir(self.path)
        old = None
        if self.out.is_dir() and not self.out.is_symlink():
            if _entries(self.out):
                if not self.replace:
                    raise UserError(f"{self.option}: {self.out} was filled while this ran; choose another path")
                old = self.out.parent / f".{self.out.name}.old-{os.getpid()}"
                os.rename(self.out, old)
            else:
                self.out.rmdir()
        os.rename(self.path, self.out)
        self.published = True
        fsync_dir(self.out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _entries(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


def _obstacle(out: Path) -> str | None:
    """What makes `out` unusable as an output directory, in words; None when it is usable."""
    if os.path.islink(out):
        target = os.readlink(out)
        try:
            out.resolve(strict=True)
        except RuntimeError:
            return f"is a symbolic link in a loop (to {target})"
        except OSError as exc:
            if exc.errno == 40:  # ELOOP
                return f"is a symbolic link in a loop (to {target})"
            return f"is a symbolic link to {target}, which does not exist"
        return f"is a symbolic link (to {target}); name the directory itself"
    existing = out
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    try:
        is_dir = existing.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        if existing == out:
            kind = "a file" if out.is_file() else "not a directory"
            return f"is {kind}"
        if os.path.islink(existing):
            return f"lies under {existing}, a symbolic link that leads to no directory"
        return f"lies under {existing}, which is {'a file' if existing.is_file() else 'not a directory'}"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is" if existing == out else f"lies under {existing}, which is"
        return f"{where} on a read-only file system" if _read_only(existing) else f"{where} not writable"
    return None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
