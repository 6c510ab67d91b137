"""The `streamflow` executable a federation runs, and the StreamFlow version it is tested with."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ....errors import UserError
from ...config.schema import FederationConfig

__all__ = ["streamflow_command", "TESTED_VERSION"]

log = logging.getLogger("supertune")

TESTED_VERSION = "0.2.0rc3"


def streamflow_command(fed: FederationConfig) -> str:
    """The streamflow executable: streamflow.command (a path, or a name on PATH); for the default
    name, <repo>/.venv-streamflow/bin/streamflow (scripts/env.sh makes it) when PATH has none.
    Its version is checked: 0.1.x cannot run these workflows."""
    from ....subprocesses import run_captured

    command = fed.streamflow.command
    found = shutil.which(os.path.expanduser(command))
    if found is None and command == "streamflow":
        import supertune

        beside = Path(supertune.__file__).resolve().parents[2] / ".venv-streamflow" / "bin" / "streamflow"
        found = str(beside) if os.access(beside, os.X_OK) else None
    if found is None:
        raise UserError(
            f"streamflow.command: {command!r} is not an executable here; install StreamFlow {TESTED_VERSION} "
            "(`bash scripts/env.sh` makes .venv-streamflow in a source checkout, or `pip install 'supertune[streamflow]'`), "
            "or set streamflow.command to its path"
        )
    answer = run_captured([found, "version"], timeout=120)
    version = answer.stdout.strip().rsplit(" ", 1)[-1] if answer.returncode == 0 else ""
    if not version.startswith("0.2"):
        raise UserError(f"streamflow.command: {found} is StreamFlow {version or '(no version answered)'}; the federation needs {TESTED_VERSION} "
                        "(0.1.x has no local deployment and always runs sbatch over SSH)")  # fmt: skip
    if version != TESTED_VERSION:
        log.warning("StreamFlow %s: the federation is tested with %s", version, TESTED_VERSION)
    return found
