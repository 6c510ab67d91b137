"""The checkpoints directory of a run:

    checkpoints/checkpoint-<step>/   published checkpoints, each with its manifest
    checkpoints/latest               the name of the newest published one (written last)
    checkpoints/.staging/            where a save writes before it is published
    checkpoints/.rejected-*/         checkpoints that failed their check, kept for inspection (never
                                     deleted by supertune: a person removes them)

A save writes into .staging, flushes every file, writes the manifest, renames the directory into
place and then moves `latest`. A kill at any moment leaves either the previous state or the new
one: a staging leftover has no manifest in place and is removed at the next start.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..durable_files import fsync_dir, fsync_tree
from .manifest import CheckpointManifest, check_files, read_manifest, write_manifest

__all__ = ["CheckpointDir", "PREFIX"]

log = logging.getLogger("supertune")

PREFIX = "checkpoint-"
LATEST = "latest"
STAGING = ".staging"
REJECTED = ".rejected-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


class CheckpointDir:
    """Checkpoints of one run, under <run dir>/checkpoints."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def staging_root(self) -> Path:
        return self.root / STAGING

    def staged(self, step: int) -> Path:
        return self.staging_root / f"{PREFIX}{step}"

    def final(self, step: int) -> Path:
        return self.root / f"{PREFIX}{step}"

    def published(self) -> list[tuple[int, Path]]:
        """Checkpoint directories in place, oldest first (their manifests unchecked)."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
        return sorted(found)

    def latest(self) -> Path | None:
        """The checkpoint `latest` names, if the pointer exists."""
        try:
            name = (self.root / LATEST).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return self.root / name if _NAME.match(name) else None

    def clear_staging(self) -> None:
        """Remove what an interrupted save left behind."""
        if self.staging_root.exists():
            log.warning(
                "removing an unfinished checkpoint save in %s (the process was stopped during a save)",
                self.staging_root,
            )
            shutil.rmtree(self.staging_root, ignore_errors=True)

    def publish(self, step: int, manifest: CheckpointManifest, fault: Callable[[str], None]) -> Path:
        """Flush the staged checkpoint of `step`, write its manifest, move it into place, then point `latest` at it."""
        staged = self.staged(step)
        fsync_tree(staged)
        fault("save.staged")
        write_manifest(staged, manifest)
        fsync_dir(staged)
        fault("save.manifest")
        final = self.final(step)
        if final.exists():
            # Reached again after resuming from an older checkpoint (this one failed its check, or
            # was written after the one `latest` names): the new save replaces it.
            shutil.rmtree(final)
        os.rename(staged, final)
        fsync_dir(self.root)
        try:
            self.staging_root.rmdir()
        except OSError:
            pass  # not empty: another step's leftover, removed at the next start
        fault("save.renamed")
        self._point_latest(final.name)
        fault("save.published")
        return final

    def _point_latest(self, name: str) -> None:
        tmp = self.root / f".{LATEST}.tmp"
        with tmp.open("w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / LATEST)
        fsync_dir(self.root)

    def rotate(self, keep: int | None) -> list[Path]:
        """Delete all but the newest `keep` checkpoints (never the one `latest` names). Rejected ones are
        never deleted: a checkpoint whose only damage is its manifest still holds good weights, and
        only a person can tell (the warning that moved it aside names it)."""
        removed: list[Path] = []
        if not keep:
            return removed
        latest = self.latest()
        published = self.published()
        for _, path in published[: max(0, len(published) - keep)]:
            if path != latest:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def resumable(self) -> tuple[Path, CheckpointManifest] | None:
        """The newest checkpoint that passes its check (sizes and sha256 of every file).

        One that fails is moved aside to .rejected-<name> with a warning, and the previous one is
        tried: a run never resumes from a damaged checkpoint.
        """
        latest = self.latest()
        for step, path in reversed(self.published()):
            try:
                manifest = read_manifest(path)
                problems = check_files(path, manifest)
            except ValueError as exc:
                problems = [str(exc)]
            if not problems:
                if latest is not None and latest != path and step < _step_of(latest):
                    log.warning(
                        "%s is newer than %s but failed its check; resuming from %s", latest.name, path.name, path.name
                    )
                return path, manifest
            rejected = self._aside(path)
            os.rename(path, rejected)
            log.warning(
                "checkpoint %s is not usable (%s); moved to %s, trying the previous one",
                path.name,
                "; ".join(problems[:3]),
                rejected.name,
            )
        return None

    def _aside(self, path: Path) -> Path:
        """A new .rejected-<name> (-2, -3, ... when one of that name is kept from before)."""
        rejected, n = self.root / f"{REJECTED}{path.name}", 1
        while os.path.lexists(rejected):
            n += 1
            rejected = self.root / f"{REJECTED}{path.name}-{n}"
        return rejected


def _step_of(path: Path) -> int:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1
