"""CLI overrides: `section.key=value` strings merged over the YAML data."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

__all__ = ["OverrideValue", "parse_overrides", "deep_merge"]


class OverrideValue:
    """A command-line value, kept both as typed (YAML scalar or list) and as the raw text.

    String fields take the raw text, so `data.template=Write about {topic}: {text}` stays a string
    instead of becoming a YAML mapping; other fields take the parsed value.
    """

    __slots__ = ("raw", "parsed")

    def __init__(self, raw: str, parsed: Any) -> None:
        self.raw = raw
        self.parsed = parsed

    def __repr__(self) -> str:
        return repr(self.raw)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ["training.max_steps=10", ...] into nested dicts; values are read as YAML scalars or lists."""
    import yaml

    problems: list[str] = []
    merged: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep:
            problems.append(f"override {item!r}: expected section.key=value, e.g. training.max_steps=100")
            continue
        if not key.strip() or any(not p for p in parts):
            problems.append(f"override {item!r}: the key is empty or has an empty part; write e.g. data.block_size=256")
            continue
        try:
            parsed = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            parsed = _UNPARSABLE
        value = OverrideValue(raw, parsed)
        node = merged
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"override {item!r}: {part} was already set to a value, not a section")
                break
            node = child
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return merged


_UNPARSABLE = object()


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return base updated by over, recursing into mappings present in both; neither input is changed."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
