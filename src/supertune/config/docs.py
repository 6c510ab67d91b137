"""Reference text of every config key, taken from the docstrings under the schema's fields.

The schema source is parsed with `ast` (no import of torch or transformers), so `--help` stays
instant and the docs can never drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from functools import cache

from . import schema
from .build import choices_of
from .schema import RunConfig

__all__ = ["ConfigKey", "config_keys", "keys_markdown", "keys_reference"]


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One dotted config key with its type, default and docstring."""

    key: str
    type: str
    default: str
    doc: str


@cache
def _field_docs(module: object = schema) -> dict[tuple[str, str], str]:
    """(class name, field name) -> the string literal that follows the field in a schema module."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    docs: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for stmt, nxt in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[(node.name, stmt.target.id)] = " ".join(nxt.value.value.split())
    return docs


def config_keys(cls: type = RunConfig, prefix: str = "") -> list[ConfigKey]:
    """Every leaf key of the schema, depth first, in declaration order."""
    docs = _field_docs(inspect.getmodule(cls))
    hints = typing.get_type_hints(cls, include_extras=True)
    instance = cls()
    out: list[ConfigKey] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out += config_keys(hint, f"{key}.")
            continue
        default = getattr(instance, f.name)
        out.append(ConfigKey(key, _type_text(hint), _default_text(default), docs.get((cls.__name__, f.name), "")))
    return out


def _type_text(hint: object) -> str:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    choices = choices_of(hint)
    if choices is not None:
        return " | ".join(choices)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, __import__("types").UnionType):
        parts = [_type_text(a) for a in args if a is not type(None)]
        return " | ".join(parts) + " | empty"
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _default_text(value: object) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if value == [] or value == {}:
        return "empty"
    return str(value)


def keys_reference(width: int = 100) -> str:
    """Plain-text reference of all keys, for `--help`."""
    lines = []
    for k in config_keys():
        lines.append(f"  {k.key} ({k.type}; default {k.default})")
        if k.doc:
            lines.append(f"      {k.doc}")
    return "\n".join(lines)


def keys_markdown() -> str:
    """docs/config.md: one table per section, generated from the schema (a test keeps it current)."""
    lines = [
        "# Run config reference",
        "",
        "Generated from `src/supertune/config/schema.py` by `supertune config keys --markdown`; do not edit by hand.",
        "Set a key in the YAML section of its first part, or on the command line as `section.key=value`.",
    ]
    section = None
    for k in config_keys():
        head = k.key.rsplit(".", 1)[0]
        if head != section:
            section = head
            lines += ["", f"## `{section}`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        doc, kind = k.doc.replace("|", "\\|"), k.type.replace("|", "\\|")
        lines.append(f"| `{k.key}` | {kind} | `{k.default}` | {doc} |")
    return "\n".join(lines) + "\n"
