"""CLI overrides: `section.key=value` strings merged over the YAML data."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

__all__ = ["OverrideValue", "Unparsable", "parse_overrides", "parse_value", "deep_merge"]


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
    """Turn ["training.max_steps=10", ...] into nested dicts; values are read as YAML scalars or lists.

    A key given again replaces its earlier value (`submit --time` relies on it); a section given
    after keys inside it (`training.max_steps=5 training={seed: 1}`) would drop them silently,
    and is refused like the reverse order.
    """
    problems: list[str] = []
    merged: dict[str, Any] = {}
    given: dict[str, str] = {}  # dotted prefix -> the override that set a key under it
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep:
            problems.append(f"override {item!r}: expected section.key=value, e.g. training.max_steps=100")
            continue
        if not key.strip() or any(not p for p in parts):
            problems.append(f"override {item!r}: the key is empty or has an empty part; write e.g. data.block_size=256")
            continue
        value = OverrideValue(raw, parse_value(raw))
        node = merged
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"override {item!r}: {part} was already set to a value, not a section")
                break
            node = child
        else:
            if isinstance(node.get(parts[-1]), dict):
                earlier = given[".".join(parts)]
                problems.append(
                    f"override {item!r}: replaces {earlier!r} given before it, which would be dropped; "
                    f"set the keys one at a time ({'.'.join(parts)}.KEY=VALUE)"
                )
                continue
            node[parts[-1]] = value
            for i in range(1, len(parts)):
                given.setdefault(".".join(parts[:i]), item)
    if problems:
        raise ConfigError(problems)
    return merged


class Unparsable:
    """The parsed side of an OverrideValue whose text YAML cannot read (syntax), or refuses; `problem` says why."""

    __slots__ = ("problem", "syntax")

    def __init__(self, problem: str, syntax: bool = False) -> None:
        self.problem = problem
        self.syntax = syntax


def parse_value(raw: str) -> Any:
    """A command-line value read as YAML, strictly (config.yaml_file); Unparsable when it cannot be."""
    import yaml

    from .yaml_file import YamlRefused, load_yaml_text

    if not raw.strip():
        return None
    try:
        return load_yaml_text(raw)
    except YamlRefused as exc:
        return Unparsable(str(exc).removeprefix("line 1: "))
    except yaml.YAMLError:
        return Unparsable("the value is not valid YAML", syntax=True)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return base updated by over, recursing into mappings present in both; neither input is changed."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
