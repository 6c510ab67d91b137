"""The federation's modes (`mode:`), one record each: how its rounds run, how `--status` tables them,
how `--dry-run` speaks of them, and the options it refuses. `federate`, `--dry-run`, `--plan` and
`--status` look a mode up here; a new mode is a new record, not a branch in each of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from .config.schema import FederationConfig, SiteConfig
    from .state.layout import FederationDir

__all__ = ["FederationMode", "MODES", "federation_mode"]


@dataclass(frozen=True)
class FederationMode:
    name: str
    run: Callable[..., None]
    """(active federation, site plans, directory, executor, everyone=the whole federation): run what is left."""
    status_table: Callable[[FederationConfig, FederationDir], str]
    """The markdown table of `--status` (and rounds.md)."""
    rounds_text: Callable[[FederationConfig], str]
    """What `--dry-run`'s first line says of the rounds."""
    site_text: Callable[[FederationConfig, SiteConfig], str]
    """What `--dry-run` says of a site's share of the training."""
    refused: dict[str, str] = field(default_factory=dict)
    """Command-line options this mode refuses -> why, and the way on (one line)."""

    def refuse(self, option: str) -> None:
        if option in self.refused:
            raise UserError(f"{option}: {self.refused[option]}")


def _run_rounds(*args: Any, **kwargs: Any) -> None:
    from .rounds.loop import run_rounds

    run_rounds(*args, **kwargs)


def _run_buffered(*args: Any, **kwargs: Any) -> None:
    from .rounds.buffered import run_buffered

    run_buffered(*args, **kwargs)


def _round_table(fed: FederationConfig, root: FederationDir) -> str:
    from .reports.table import table_markdown

    return table_markdown(fed, root)


def _version_table(fed: FederationConfig, root: FederationDir) -> str:
    from .reports.buffered_table import buffered_table_markdown

    return buffered_table_markdown(fed, root)


def _buffered_rounds(fed: FederationConfig) -> str:
    a = fed.aggregation
    return f"mode buffered: {fed.rounds} versions of K={a.buffer_size} changes, staleness {a.staleness.kind}"


def _site_rounds(fed: FederationConfig, site: SiteConfig) -> str:
    return f"rounds {site.from_round}-{site.until_round or fed.rounds}, {site.steps_per_round} steps each"


MODES: dict[str, FederationMode] = {
    "synchronous": FederationMode(
        "synchronous",
        run=_run_rounds,
        status_table=_round_table,
        rounds_text=lambda fed: f"{fed.rounds} rounds",
        site_text=_site_rounds,
    ),
    "buffered": FederationMode(
        "buffered",
        run=_run_buffered,
        status_table=_version_table,
        rounds_text=_buffered_rounds,
        site_text=lambda fed, site: f"{site.steps_per_round} steps per change, from the newest version",
        refused={
            "--skip-site": "mode: buffered has no round to leave a site out of; use --drop to stop a site",
            "--plan": "the cost forecast of mode: buffered is not written yet (it forecasts rounds); "
            "see the versions so far with --status",
        },
    ),
}


def federation_mode(fed: FederationConfig) -> FederationMode:
    """The record of the federation's mode (its value is checked when the config is loaded)."""
    return MODES[fed.mode]
