"""resolution.json in a run directory: how its config.yaml was resolved.

It names every layer with the files behind it and their sha256, so a run can later show that it was
made with a given cluster profile file (and which one, when a user file is merged over the shipped
one), and --origin's answer for every key.
"""

from __future__ import annotations

from typing import Any

from ..file_table import sha256_file
from ..rundir import RunDir, write_json_atomic
from .resolve import Resolution

__all__ = ["resolution_record", "write_resolution"]

ORDER = "defaults < cluster profile run_config < base < YAML file < command line"


def resolution_record(resolution: Resolution) -> dict[str, Any]:
    profile = None
    if resolution.profile is not None:
        layer = next(layer for layer in resolution.layers if layer.name.startswith("profile "))
        profile = {"name": resolution.profile.name, "files": [_file(path) for path in layer.files]}
    return {
        "order": ORDER,
        "layers": ["default"] + [layer.name for layer in resolution.layers],
        "profile": profile,
        "config_files": [
            _file(path) for layer in resolution.layers if not layer.name.startswith("profile ") for path in layer.files
        ],
        "overrides": list(resolution.overrides),
        "origins": resolution.origins(),
    }


def write_resolution(run: RunDir, resolution: Resolution) -> None:
    write_json_atomic(run.resolution, resolution_record(resolution))


def _file(path: str) -> dict[str, str]:
    return {"path": path, "sha256": sha256_file(path)}
