"""The exact package versions supertune is tested with (package data: pinned-requirements.txt)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from ..errors import UserError

__all__ = ["Pin", "read_pins", "runtime_pins", "canonical_name", "TEST_ONLY"]

PINS_FILE = "pinned-requirements.txt"
# Packages only the test suite needs (the `test` extra of pyproject.toml): kept out of images.
TEST_ONLY = frozenset({"pytest", "ruff"})
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


@dataclass(frozen=True)
class Pin:
    """One `name==version` line."""

    name: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def key(self) -> str:
        return canonical_name(self.name)


def canonical_name(name: str) -> str:
    """PEP 503 normal form: PyYAML, pyyaml and py_yaml are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str | None = None) -> list[Pin]:
    """Every pin of pinned-requirements.txt (or of `text`), in file order."""
    if text is None:
        text = resources.files("supertune").joinpath(PINS_FILE).read_text(encoding="utf-8")
    pins = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            # The file is ours: a line that is not name==version is a packaging mistake, not user input.
            raise UserError(f"{PINS_FILE} line {number}: {line!r} is not name==version")
        pins.append(Pin(match.group(1), match.group(2)))
    return pins


def runtime_pins(pins: list[Pin] | None = None) -> list[Pin]:
    """The pins a training image needs: all but the test tools."""
    return [p for p in (read_pins() if pins is None else pins) if p.key not in TEST_ONLY]
