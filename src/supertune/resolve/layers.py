"""The layers a run config is made of, lowest first, and which layer set each key.

A layer is plain data (nested mappings, command-line values at the leaves) with the name it is
shown under: "profile ibex", the YAML file's path, "command line". Merging is `deep_merge`: a
mapping merges key by key, anything else (lists included) replaces what lower layers had.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from ..config.build import section_fields
from ..config.overrides import deep_merge
from ..config.schema import RunConfig

__all__ = ["Layer", "merge_layers", "leaf_keys", "origins", "DEFAULTS"]

DEFAULTS = "default"
"""The origin of a key that no layer set."""


@dataclass(frozen=True)
class Layer:
    """One source of config values."""

    name: str
    """How --origin and resolution.json name it."""
    data: dict[str, Any]
    files: tuple[str, ...] = field(default=())
    """The files it was read from (a profile may be a shipped file and the user's file over it)."""


def merge_layers(layers: list[Layer]) -> dict[str, Any]:
    """The data of all layers, each over the ones before it."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = deep_merge(merged, layer.data)
    return merged


def leaf_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema that holds a value (sections are walked into), in schema order."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for name in section_fields(cls):
        if dataclasses.is_dataclass(hints[name]):
            out += leaf_keys(hints[name], f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def origins(layers: list[Layer]) -> dict[str, str]:
    """Dotted key -> the name of the last layer that set it; keys no layer set are left out."""
    found: dict[str, str] = {}
    for key in leaf_keys():
        for layer in layers:
            if _holds(layer.data, key.split(".")):
                found[key] = layer.name
    return found


def _holds(data: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True
