"""Words of a command line that is written now and run later, on the nodes of a job."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Expand"]


@dataclass(frozen=True)
class Expand:
    """A word whose $NAME / ${NAME} references expand where the command runs (e.g. SLURM_NODEID on
    each node, or $USER in a profile's image path); everything else in it stays literal."""

    text: str
