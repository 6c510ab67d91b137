"""`supertune config show --origin`: each value that is not the default, with the layer that set it."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config.schema import RunConfig
from .layers import DEFAULTS, leaf_keys
from .resolve import Resolution

__all__ = ["origin_lines"]


def origin_lines(resolution: Resolution) -> list[str]:
    """`key: value  # layer` for every key a layer set or whose value differs from the default."""
    import yaml

    found = resolution.origins()
    default = RunConfig()
    lines = []
    for key in leaf_keys():
        value = _value(resolution.config, key)
        if key not in found and value == _value(default, key):
            continue
        text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6).strip()
        text = text.removesuffix("...").strip()
        lines.append(f"{key}: {text}  # {found.get(key, DEFAULTS)}")
    return lines


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
