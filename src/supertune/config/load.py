"""Typed run configs from plain data, and back: build, check, make paths absolute, dump.

Which layers make up a new run's config (defaults, cluster profile, YAML, command line) is decided
in one place above this package, `supertune.resolve`. Here a saved, already resolved config
(a run directory's config.yaml) is read back exactly as it was written.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..file_formats import expand_files
from ..state_records import DamagedFile
from .build import build_config, build_config_and_problems
from .errors import ConfigError
from .schema import RunConfig
from .validate import config_problems
from .yaml_file import read_config_file

__all__ = [
    "build_run_config",
    "load_saved_config",
    "read_saved_sections",
    "absolute_paths",
    "config_to_dict",
    "dump_config",
]

SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))
"""The sections of a run config (model, data, training, ...): each one a mapping in its YAML."""


def build_run_config(data: dict[str, Any]) -> RunConfig:
    """Type-check merged data, validate it (every problem in one ConfigError), and make paths absolute."""
    cfg, problems = build_config_and_problems(RunConfig, data)
    problems += config_problems(cfg)  # a field with a problem above holds its default: no second line for it
    if problems:
        raise ConfigError(problems)
    return absolute_paths(cfg)


def load_saved_config(path: str | os.PathLike[str], files_here: bool = True) -> RunConfig:
    """A resolved config file as it is: no cluster profile or other layer is applied to it again.

    files_here=False: the run's files are on another machine (a federated site reached over SSH):
    only types and keys are checked, paths stay as written; the site checks the rest where they are."""
    data = read_config_file(path)
    return build_run_config(data) if files_here else build_config(RunConfig, data)


def read_saved_sections(path: str | os.PathLike[str], fix: str) -> dict[str, dict[str, Any]]:
    """A run directory's config.yaml as plain data, for readers that use a few of its values without
    building the whole config (a report, an evaluation of the run's model): each section it holds is
    a mapping, or the file is a DamagedFile naming the section (supertune wrote mappings there), with
    `fix`. The readers check each value they use (state_records.record_damage)."""
    data = read_config_file(path)
    for name in SECTIONS:
        if name in data and not isinstance(data[name], dict):
            raise DamagedFile(path, f"{name} is {_kind(data[name])}, not a mapping of settings", fix)
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true or false"
    return {list: "a list", str: "text", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def absolute_paths(cfg: RunConfig) -> RunConfig:
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
    ds = cfg.distributed.deepspeed_config
    if ds and os.path.exists(os.path.expanduser(ds)):
        cfg.distributed.deepspeed_config = os.path.abspath(os.path.expanduser(ds))
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain data of a config dataclass."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any) -> str:
    """YAML text of a resolved config, sections in schema order."""
    import yaml

    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)
