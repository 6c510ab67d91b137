"""`supertune federate`: load the federation, find or create its directory, run the unfinished rounds."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import UserError
from .layout import FederationDir
from .load import federation_text, load_federation
from .schema import FederationConfig

__all__ = ["federate", "federation_status", "federation_dir"]

log = logging.getLogger("supertune")


def federation_dir(fed: FederationConfig, resumed: Path | None, explicit: str | None) -> FederationDir:
    """The directory of this federation: the one resumed, --dir, or runs/<name>."""
    if resumed is not None:
        if explicit and Path(explicit).expanduser().absolute() != resumed:
            raise UserError(
                f"--dir: {explicit!r} differs from the federation directory given ({resumed}); give one of them"
            )
        return FederationDir(resumed)
    return FederationDir(Path(explicit or Path("runs") / fed.name).expanduser().absolute())


def federate(path: str | None, explicit_dir: str | None, drop: list[str] | None = None) -> FederationDir:
    """Run (or resume) the federation in `path`, first dropping the sites in `drop`; returns its directory."""
    from .history import active_federation, drop_sites, first_unfinished_round, record_failure
    from .rounds import run_rounds
    from .sites import resolve_sites

    fed, resumed = load_federation(path)
    root = federation_dir(fed, resumed, explicit_dir)
    text = federation_text(fed)
    if root.config.is_file():
        if root.config.read_text(encoding="utf-8") != text and not _same_settings(text, root):
            raise UserError(_other_settings(fed, root))
        log.info("resuming the federation in %s", root.path)
    elif drop:
        raise UserError(
            f"--drop: {root.path} holds no federation yet; leave the site out of the federation YAML instead"
        )
    else:
        root.path.mkdir(parents=True, exist_ok=True)
        log.info("federation %s: %d sites, %d rounds, in %s", fed.name, len(fed.sites), fed.rounds, root.path)
    if drop:
        drop_sites(fed, root, drop)
    active = active_federation(fed, root)  # without the dropped sites: the rounds still to run
    try:
        plans = resolve_sites(active)  # every site's config checked before anything is written
    except UserError as exc:
        if root.config.is_file():  # a federation under way: a site's data withdrawn, a profile gone; --status shows it
            record_failure(fed, root, first_unfinished_round(fed, root), str(exc))
        raise
    if fed.benchmarks:
        from ..benchmarks import check_tasks

        check_tasks(fed.benchmarks, "benchmarks")  # a wrong name or missing data before round 1, not after it
    if not root.config.is_file():
        root.config.write_text(text, encoding="utf-8")
    run_rounds(active, plans, root, _executor(active, root), everyone=fed)
    return root


def _same_settings(text: str, root: FederationDir) -> bool:
    """Whether the federation saved in `root` loads to the settings `text` records: a federation.yaml
    written before a key existed lacks it, and reads as that key's default."""
    try:
        saved, _ = load_federation(root.path)
    except UserError:
        return False
    return federation_text(saved) == text


def _other_settings(fed: FederationConfig, root: FederationDir) -> str:
    """Why the YAML given is refused for the existing federation, and the way on."""
    import dataclasses

    generic = (
        f"--dir: {root.path} holds a federation with other settings; resume it with `supertune federate {root.path}` "
        "or choose another --dir"
    )
    try:
        saved, _ = load_federation(root.path)
    except UserError:  # the saved one no longer loads (a site config moved): the plain refusal
        return generic
    names = {s.name for s in fed.sites}
    missing = [s.name for s in saved.sites if s.name not in names]
    kept = dataclasses.replace(saved, sites=[s for s in saved.sites if s.name in names])
    if missing and federation_text(kept) == federation_text(fed):
        words = " ".join(f"--drop {name}" for name in missing)
        return (
            f"sites: {', '.join(missing)} left out of the YAML of the federation in {root.path}; to drop a site and keep "
            f"its rounds in the history, run `supertune federate {root.path} {words}`"
        )
    return generic


def _executor(fed: FederationConfig, root: FederationDir):
    if fed.executor == "streamflow":
        from .streamflow import StreamFlowExecutor

        return StreamFlowExecutor(fed, root)
    from .builtin import BuiltinExecutor

    return BuiltinExecutor(fed)


def federation_status(directory: str) -> str:
    """The per-round table of a federation directory, from its receipts."""
    from .table import table_markdown

    fed, resumed = load_federation(directory)
    if resumed is None:
        raise UserError(f"--status: {directory!r} is not a federation directory (no federation.yaml)")
    return table_markdown(fed, FederationDir(resumed))
