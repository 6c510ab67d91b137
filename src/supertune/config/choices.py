"""Choices that come from a table of the code rather than from the schema's text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OneOf"]


@dataclass(frozen=True)
class OneOf:
    """`Annotated[str, OneOf(names)]`: a string field whose valid values are `names()` when the config
    is built, so that a record added to the table (e.g. a launcher) is accepted, documented and
    offered as a choice everywhere without another edit."""

    names: Callable[[], list[str]]
