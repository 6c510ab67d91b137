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


def federate(path: str | None, explicit_dir: str | None) -> FederationDir:
    """Run (or resume) the federation in `path`; returns its directory."""
    from .rounds import run_rounds
    from .sites import resolve_sites

    fed, resumed = load_federation(path)
    root = federation_dir(fed, resumed, explicit_dir)
    text = federation_text(fed)
    if root.config.is_file():
        if root.config.read_text(encoding="utf-8") != text:
            raise UserError(
                f"--dir: {root.path} holds a federation with other settings; resume it with `supertune federate {root.path}` "
                "or choose another --dir"
            )
        log.info("resuming the federation in %s", root.path)
    else:
        root.path.mkdir(parents=True, exist_ok=True)
        log.info("federation %s: %d sites, %d rounds, in %s", fed.name, len(fed.sites), fed.rounds, root.path)
    plans = resolve_sites(fed)  # every site's config checked before anything is written
    if not root.config.is_file():
        root.config.write_text(text, encoding="utf-8")
    run_rounds(fed, plans, root, _executor(fed, root))
    return root


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
