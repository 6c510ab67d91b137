"""The one place where a run config is assembled: defaults < run YAML < CLI overrides."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ..data.formats import expand_files
from .build import build_config
from .errors import ConfigError
from .overrides import deep_merge, parse_overrides
from .schema import RunConfig
from .validate import validate

__all__ = ["load_run_config", "read_yaml", "read_yaml_mapping", "config_to_dict", "dump_config"]


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
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


def load_run_config(path: str | None = None, overrides: list[str] | None = None, base: dict[str, Any] | None = None) -> RunConfig:
    """Merge defaults < base data < the YAML file < the cluster profile's run_config < overrides,
    type-check, validate, and make paths absolute."""
    data = deep_merge(base or {}, read_yaml(path) if path else {})
    cli = parse_overrides(overrides) if overrides else {}
    profile_values = _cluster_run_config(deep_merge(data, cli))
    data = deep_merge(deep_merge(data, profile_values), cli)
    cfg = build_config(RunConfig, data)
    validate(cfg)
    return _resolve_paths(cfg)


def _cluster_run_config(data: dict[str, Any]) -> dict[str, Any]:
    """The run-config values of the cluster named by launch.cluster (none for local or a bad name,
    which validation reports with the other problems)."""
    launch = data.get("launch")
    name = launch.get("cluster") if isinstance(launch, dict) else None
    if hasattr(name, "raw"):  # a command-line value
        name = name.raw
    if not isinstance(name, str) or name == "local":
        return {}
    from ..clusters import load_profile
    from ..errors import UserError

    try:
        return load_profile(name).run_config
    except UserError:
        return {}


def _resolve_paths(cfg: RunConfig) -> RunConfig:
    """Expand globs and make paths absolute, so the resolved config reruns from any directory."""
    d = cfg.data
    d.train_files = expand_files(d.train_files)
    d.validation_files = expand_files(d.validation_files)
    if d.store:
        d.store = os.path.abspath(os.path.expanduser(d.store))
    m = cfg.model
    for name in ("name_or_path", "tokenizer", "bundle"):
        ref = getattr(m, name)
        if ref and ref != "train" and os.path.exists(os.path.expanduser(ref)):
            setattr(m, name, os.path.abspath(os.path.expanduser(ref)))
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain data of a config dataclass."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any) -> str:
    """YAML text of a resolved config, sections in schema order."""
    import yaml

    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)
