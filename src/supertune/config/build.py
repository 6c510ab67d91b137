"""Turn plain data (merged YAML and overrides) into typed config objects, checking every type.

Problems are collected, never raised one at a time: the caller gets every wrong key and value of a
config in one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
import types
import typing
from functools import cache
from typing import Annotated, Any, Literal, Union

from .choices import OneOf
from .errors import ConfigError
from .overrides import OverrideValue, Unparsable, parse_value

__all__ = ["build_config", "build_config_and_problems", "choices_of", "parse_key_values", "section_fields"]

_MISSING = object()
INT_LIMIT = 2**63
"""Every integer field holds a signed 64-bit value: what torch, numpy and Slurm take."""
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxlong = 2, 4, 4, 60, 40


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def choices_of(hint: Any) -> list[str] | None:
    """The valid values of an `Annotated[str, OneOf(...)]` field now, or None for any other type."""
    if typing.get_origin(hint) is Annotated:
        for meta in typing.get_args(hint)[1:]:
            if isinstance(meta, OneOf):
                return meta.names()
    return None


def section_fields(cls: type) -> list[str]:
    """Field names of a config dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]


def build_config(cls: type, data: Any) -> Any:
    """Build dataclass `cls` from nested dicts; raise one ConfigError listing every problem."""
    built, problems = build_config_and_problems(cls, data)
    if problems:
        raise ConfigError(problems)
    return built


def build_config_and_problems(cls: type, data: Any) -> tuple[Any, list[str]]:
    """Build dataclass `cls` from nested dicts, and every problem found. An unknown key or a value of
    the wrong type is left out, so its field keeps its default: the config is still whole, and the
    caller can check the rest of it and report every problem of the config at once."""
    problems: list[str] = []
    built = _build_dataclass(cls, data, "", problems, root=cls)
    return built, problems


def _build_dataclass(cls: type, data: Any, where: str, problems: list[str], root: type) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        name = where or "the config"
        problems.append(f"{name}: expected a mapping of keys to values, got {_show(data)}")
        return cls()
    hints = _hints(cls)
    names = section_fields(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in names:
            problems.append(f"{dotted}: unknown key{_suggest(str(key), names, where, root)}")
            continue
        converted = _convert(hints[key], value, dotted, problems, root)
        if converted is not _MISSING:
            kwargs[key] = converted
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str, problems: list[str], root: type) -> Any:
    """Convert `value` to `hint`, or record a problem and return _MISSING (the default is kept)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(value, OverrideValue):
        value = _pick_override(hint, value)
        if isinstance(value, Unparsable):
            problems.append(
                f"{where}: {value.problem}" + (f"; quote it, e.g. {where}='[a, b]'" if value.syntax else "")
            )
            return _MISSING
    if origin is Literal and isinstance(value, bool) and ("yes" if value else "no") in args:
        value = "yes" if value else "no"  # YAML 1.1 reads an unquoted no/yes as a boolean
    if dataclasses.is_dataclass(hint):
        return _build_dataclass(hint, value, where, problems, root)
    choices = choices_of(hint)
    if choices is not None:
        if value in choices:
            return value
        problems.append(f"{where}: {_show(value)} is not one of {', '.join(choices)}{_close(str(value), choices)}")
        return _MISSING
    if origin is Annotated:
        return _convert(args[0], value, where, problems, root)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None or value == "":
            return None
        # Union[...] is the one spelling of a union whose members are known only at run time.
        return _convert(non_none[0] if len(non_none) == 1 else Union[tuple(non_none)], value, where, problems, root)  # noqa: UP007
    if origin is Literal:
        if value in args:
            return value
        choices = ", ".join(str(a) for a in args if a is not None)
        hint_text = _close(str(value), [str(a) for a in args])
        problems.append(f"{where}: {_show(value)} is not one of {choices}{hint_text}")
        return _MISSING
    if origin is list:
        return _convert_list(args[0], value, where, problems, root)
    if origin is dict:
        return _convert_dict(value, where, problems)
    scalar = _convert_scalar(hint, value)
    if scalar is _MISSING:
        problems.append(f"{where}: expected {_type_name(hint)}, got {_show(value)}{_quote_hint(hint, value)}")
    elif hint is float and not math.isfinite(scalar):
        problems.append(f"{where}: {_show(value)} is not a finite number; write a number such as 0.001")
        return _MISSING
    elif hint is int and not -INT_LIMIT <= scalar < INT_LIMIT:
        problems.append(
            f"{where}: {_show(value)} is out of range (integers are within +-2**63); write a smaller number"
        )
        return _MISSING
    elif hint is str and not _utf8(scalar):
        # Bytes the shell could not decode arrive as lone surrogates, which no file or tokenizer takes.
        problems.append(f"{where}: {_show(value)} is not valid UTF-8 text; give the value in UTF-8")
        return _MISSING
    return scalar


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _quote_hint(hint: Any, value: Any) -> str:
    if hint is not str:
        return ""
    if isinstance(value, (dict, list)):
        return " (quote it: YAML reads {...} and [...] as structures)"
    if isinstance(value, bool):
        return " (YAML reads an unquoted yes/no/on/off/true/false as a boolean: quote the text)"
    return ""


def _pick_override(hint: Any, value: OverrideValue) -> Any:
    """Raw text for string fields (and a choice spelled out), the YAML-parsed value for the rest."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if not value.raw.strip():
            return None
        if len(non_none) == 1:
            hint, args = non_none[0], typing.get_args(non_none[0])
    if hint is str or choices_of(hint) is not None:
        return value.raw
    if typing.get_origin(hint) is Literal and value.raw in args:
        return value.raw
    return value.parsed


def _convert_list(item: Any, value: Any, where: str, problems: list[str], root: type) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]  # one path or glob is the common case; a list is the general one
    if not isinstance(value, list):
        problems.append(f"{where}: expected a list of {_type_name(item)}, got {_show(value)}")
        return _MISSING
    out = []
    for i, element in enumerate(value):
        converted = _convert(item, element, f"{where}[{i}]", problems, root)
        if converted is not _MISSING:
            out.append(converted)
    return out


def _convert_dict(value: Any, where: str, problems: list[str]) -> Any:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            return parse_key_values(value)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            return _MISSING
    if not isinstance(value, dict):
        problems.append(f'{where}: expected a mapping or "key=value,key=value", got {_show(value)}')
        return _MISSING
    names = [k for k in value if not isinstance(k, str)]
    if names:
        problems.append(
            f"{where}: {_show(names[0])} is not a name; keys are names such as num_hidden_layers (quote a key YAML reads as a number)"
        )
        return _MISSING
    return _plain(value)


def _plain(value: Any) -> Any:
    """A mapping field's data with command-line values (section.key.name=value) read as YAML values."""
    if isinstance(value, OverrideValue):
        return None if isinstance(value.parsed, Unparsable) else value.parsed
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _convert_scalar(hint: Any, value: Any) -> Any:
    if hint is bool:
        return value if isinstance(value, bool) else _MISSING
    if hint is int:
        if isinstance(value, bool):
            return _MISSING
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return _MISSING
            return int(number) if number.is_integer() else _MISSING
        return _MISSING
    if hint is float:
        if isinstance(value, bool):
            return _MISSING
        if isinstance(value, (int, float)):
            return (
                float(value) if not isinstance(value, int) or value.bit_length() < 1024 else math.inf
            )  # refused as not finite
        if isinstance(value, str):
            # PyYAML reads "2e-3" as a string (YAML 1.1 wants "2.0e-3"): accept what people write.
            try:
                return float(value)
            except ValueError:
                return _MISSING
        return _MISSING
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return _MISSING
    if hint is Any:
        return value
    return value if isinstance(value, hint) else _MISSING


def parse_key_values(text: str) -> dict[str, Any]:
    """Parse run_clm-style overrides "a=1,b=x" into {"a": 1, "b": "x"} (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f'{part!r} is not key=value (write e.g. "num_hidden_layers=2,hidden_size=64")')
        value = parse_value(raw)
        if isinstance(value, Unparsable):
            raise ValueError(f"{key.strip()}={raw}: {value.problem}")
        out[key.strip()] = value
    return out


def _suggest(key: str, names: list[str], where: str, root: type) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        prefix = f"{where}." if where else ""
        return f" (did you mean {prefix}{close[0]}?)"
    # The key may belong to another section: training.block_size -> data.block_size.
    for section, cls in _sections(root):
        if section != where and key in section_fields(cls):
            return f" (did you mean {section}.{key}?)"
    if names:
        return f" (known keys: {', '.join(names)})"
    return ""


def _sections(root: type) -> list[tuple[str, type]]:
    out = []
    for name, hint in _hints(root).items():
        if dataclasses.is_dataclass(hint):
            out.append((name, hint))
            out += [(f"{name}.{sub}", cls) for sub, cls in _sections(hint)]
    return out


def _close(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f" (did you mean {close[0]}?)" if close else ""


def _type_name(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _show(value: Any) -> str:
    """A short repr; a large value (a YAML alias expansion, a long list) is never rendered whole."""
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
