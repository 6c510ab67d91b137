"""Reading YAML strictly: run configs, cluster profiles, federation configs and command-line values.

This is the bottom of the config layer: cluster profiles (which sit above the run config) and
federation configs read their files through it too, so every YAML file of supertune fails the same
way, one line naming the file, the line and the key.

YAML 1.1 (what PyYAML reads) has traps that turn a plausible file into other values without a word;
they are refused here, each with the fix:

- a key given twice in one mapping (YAML keeps the last one silently);
- unquoted base-60 numbers: `time: 1:00` reads as 60 and `12:00:00` as 43200;
- aliases that expand into more than MAX_VALUES values (a few hundred bytes of nested aliases
  expand into billions), that refer to themselves, or nesting deeper than MAX_DEPTH levels (which
  would end in a RecursionError somewhere further on);
- integers with thousands of digits, and files over MAX_FILE_BYTES.

Keys spelled yes/no/on/off (which YAML reads as true/false) are kept as the text written, so
`on: 3` is reported as the unknown key `on`, not `True`. Values spelled so stay booleans: a
string field that receives one says to quote it (`supertune.config.build`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from ..errors import first_line
from .errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "MAX_FILE_BYTES",
    "YamlRefused",
    "load_yaml_text",
    "read_config_file",
    "read_yaml_mapping",
]

MAX_DEPTH = 40
"""Nesting levels a YAML document may have (a run config has 3 or 4)."""
MAX_VALUES = 100_000
"""Values (scalars, lists and mappings) a document may expand to through its aliases."""
MAX_FILE_BYTES = 4 << 20
"""Size of a config file: a run config is a few KB, a federation config with many sites some 100 KB."""
MAX_INT_DIGITS = 40
"""Longer integers are refused before Python is asked to convert them (it refuses past 4300 digits)."""

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_WORDS = {"yes", "no", "on", "off"}


class YamlRefused(ValueError):
    """YAML that parses but is refused (see the module docstring); the message names the key, the line and the fix."""


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a run config's YAML mapping; every failure becomes a ConfigError naming the file."""
    return read_yaml_mapping(Path(path), "config file", "sections (model:, data:, training:, ...)")


def read_yaml_mapping(path: Path, what: str, shape: str) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping; `what` names the file in errors ("cluster profile")."""
    import yaml

    name = f"{what} {str(path)!r}"
    try:
        info = os.stat(path)
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            raise ConfigError([f"{name} does not exist"]) from None
        raise ConfigError([f"{name} cannot be read: {exc.strerror}"]) from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError([f"{name} is a directory; give a YAML file"])
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError([f"{name} is not a regular file ({_file_kind(info.st_mode)}); give a YAML file"])
    if info.st_size > MAX_FILE_BYTES:
        raise ConfigError(
            [f"{name} is {info.st_size} bytes; a config file is at most {MAX_FILE_BYTES >> 20} MiB of YAML"]
        )
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"))
    except YamlRefused as exc:
        raise ConfigError([f"{name}: {exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise ConfigError([f"{name} is not valid YAML{at}: {problem}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{name} is not UTF-8 text"]) from None
    except OSError as exc:
        raise ConfigError([f"{name} cannot be read: {exc.strerror}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{name}: the top level must be a mapping of {shape}"])
    return data


def load_yaml_text(text: str) -> Any:
    """The value of one YAML document, read strictly (see the module docstring).

    Raises YamlRefused for what is refused and yaml.YAMLError for text that is not YAML.
    """
    loader = _strict_loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, loader)
        try:
            return loader.construct_document(node)
        except (ValueError, TypeError, AttributeError) as exc:  # a constructor's own error, past _check_nodes
            raise YamlRefused(
                f"line {node.start_mark.line + 1}: a value cannot be read as its YAML type ({exc})"
            ) from None
    finally:
        loader.dispose()


def _strict_loader_class() -> Any:
    """SafeLoader with a depth limit while composing (PyYAML composes recursively)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class StrictLoader(yaml.SafeLoader):
            depth = 0

            def compose_node(self, parent: Any, index: Any) -> Any:
                self.depth += 1
                try:
                    if self.depth > MAX_DEPTH:
                        line = self.peek_event().start_mark.line + 1
                        raise YamlRefused(
                            f"line {line}: nested deeper than {MAX_DEPTH} levels; a config is a few levels deep"
                        )
                    return super().compose_node(parent, index)
                finally:
                    self.depth -= 1

        _LOADER = StrictLoader
    return _LOADER


_LOADER: Any = None


def _check_nodes(root: Any, loader: Any) -> None:
    """Walk the composed document once (each node once, aliases included), refusing what the module
    docstring lists; rewrites yes/no/on/off keys to strings. Iterative: aliases can make the
    expanded document deeper than Python's recursion limit."""
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    aliased = _has_aliases(root)
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, str, bool]] = [(root, "", False)]
    while stack:
        node, where, done = stack.pop()
        key = id(node)
        if done:
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for _, c in children)
            depth[key] = 1 + max((depth[id(c)] for _, c in children), default=0)
            on_path.discard(key)
            if aliased and size[key] > MAX_VALUES:
                raise YamlRefused(
                    f"{_at(where, node)}: its aliases expand to more than {MAX_VALUES} values; write the values out"
                )
            if depth[key] > MAX_DEPTH:
                raise YamlRefused(
                    f"{_at(where, node)}: its aliases nest deeper than {MAX_DEPTH} levels; write the values out"
                )
            continue
        if key in size:
            continue  # a node reached again through an alias: checked once
        if key in on_path:
            raise YamlRefused(
                f"{_at(where, node)}: an alias refers to the value that contains it; YAML values cannot hold themselves"
            )
        on_path.add(key)
        stack.append((node, where, True))
        if isinstance(node, ScalarNode):
            _check_scalar(node, where, loader)
        elif isinstance(node, MappingNode):
            _check_keys(node, where)
        for name, child in reversed(_children(node)):
            if isinstance(child, (ScalarNode, SequenceNode, MappingNode)):
                stack.append(
                    (child, f"{where}{name}" if name.startswith("[") or not where else f"{where}.{name}", False)
                )


def _children(node: Any) -> list[tuple[str, Any]]:
    from yaml.nodes import MappingNode, SequenceNode

    if isinstance(node, SequenceNode):
        return [(f"[{i}]", child) for i, child in enumerate(node.value)]
    if isinstance(node, MappingNode):
        return [(_key_text(k), v) for k, v in node.value] + [
            (_key_text(k) + " (key)", k) for k, _ in node.value if not _is_scalar(k)
        ]
    return []


def _has_aliases(root: Any) -> bool:
    """Whether some node is reached twice (an alias), found without expanding anything."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return True
        seen.add(id(node))
        stack += [child for _, child in _children(node)]
    return False


def _is_scalar(node: Any) -> bool:
    from yaml.nodes import ScalarNode

    return isinstance(node, ScalarNode)


def _key_text(node: Any) -> str:
    return str(node.value) if _is_scalar(node) else "<key>"


def _at(where: str, node: Any) -> str:
    line = f"line {node.start_mark.line + 1}"
    return f"{where} at {line}" if where else line


def _check_scalar(node: Any, where: str, loader: Any) -> None:
    text = str(node.value)
    if node.tag in (_INT_TAG, _FLOAT_TAG) and ":" in text:
        value = _base60(text)
        key = where.rsplit(".", 1)[-1]
        quoted = f'{key}: "{text}"' if key and not key.endswith("]") else f'"{text}"'
        raise YamlRefused(
            f"{_at(where, node)}: YAML 1.1 reads the unquoted {text} as the base-60 number {value}; "
            f"quote it ({quoted}) or write the number you mean"
        )
    if node.tag == _INT_TAG and sum(c.isdigit() for c in text) > MAX_INT_DIGITS:
        raise YamlRefused(
            f"{_at(where, node)}: an integer of {sum(c.isdigit() for c in text)} digits is out of any range supertune accepts"
        )
    try:
        # A scalar YAML reads as a date that does not exist (2001-02-30), or tagged !!float abc, fails
        # in its constructor with a plain ValueError; constructed here it is named with its line.
        loader.construct_object(node, deep=True)
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        kind = node.tag.rsplit(":", 1)[-1]
        raise YamlRefused(
            f"{_at(where, node)}: {text[:60]!r} cannot be read as a YAML {kind} ({exc}); quote it to keep it as text"
        ) from None


def _base60(text: str) -> int | float:
    sign = -1 if text.startswith("-") else 1
    value: float = 0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        value = value * 60 + (float(part) if "." in part else int(part))
    return sign * value


def _check_keys(node: Any, where: str) -> None:
    """Duplicate keys refused; yes/no/on/off keys kept as written."""
    seen: dict[tuple[str, str], Any] = {}
    for key_node, _ in node.value:
        if not _is_scalar(key_node) or key_node.tag == _MERGE_TAG:
            continue
        if key_node.tag == _BOOL_TAG and str(key_node.value).lower() in _BOOL_WORDS:
            key_node.tag = _STR_TAG
        ident = (key_node.tag, str(key_node.value))
        if ident in seen:
            first = seen[ident].start_mark.line + 1
            dotted = f"{where}.{key_node.value}" if where else str(key_node.value)
            raise YamlRefused(
                f"{dotted} at line {key_node.start_mark.line + 1}: the key is given twice (first at line {first}); "
                "YAML would keep the last one silently: remove one"
            )
        seen[ident] = key_node


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a plain file")
