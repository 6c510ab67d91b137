"""Reading YAML files whose top level is a mapping: run configs and cluster profiles alike.

This is the bottom of the config layer: cluster profiles (which sit above the run config) read their
files through it too, so every YAML file of supertune fails the same way, one line naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["read_config_file", "read_yaml_mapping"]


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a run config's YAML mapping; every failure becomes a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"config file {str(p)!r} does not exist"])
    return read_yaml_mapping(p, "config file", "sections (model:, data:, training:, ...)")


def read_yaml_mapping(path: Path, what: str, shape: str) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping; `what` names the file in errors ("cluster profile")."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{what} {str(path)!r} is not valid YAML{at}: {problem}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{what} {str(path)!r} is not UTF-8 text"]) from None
    except OSError as exc:
        raise ConfigError([f"{what} {str(path)!r} cannot be read: {exc.strerror}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{what} {str(path)!r}: the top level must be a mapping of {shape}"])
    return data
