"""The executors a federation's rounds can run on: one record each, and the config's choices
(`executor:`), what each refuses and checks, the executor `supertune federate` starts and what
`federate --dry-run` says of it all derive from this table. Adding an executor is one record (its
module, with a class that runs a round's work) and its tests.

- builtin: local processes and SLURM jobs on clusters reachable from this machine.
- streamflow: each round as one StreamFlow workflow (CWL), sites reached over SSH or here.
- agents: each site runs its own agent (`supertune federate --site NAME EXCHANGE`), which meets this
  machine at an exchange; the sites' run configs and cluster profiles are files at the sites.

The record names its executor's factory as `module:attribute`, imported only when a federation
starts (as supertune.entry names its entry points): the schema takes its choices from this table,
so the table stands below the schema (it names the federation's config only as Any) and far below
the rounds and executors it starts, and reading a federation's settings loads no executor.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .site_login import SiteLogin, streamflow_site_problems

__all__ = ["ExecutorKind", "EXECUTORS", "executor_names", "executor_kind", "start_executor", "dry_run_additions"]


def _no_problems(*_: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class ExecutorKind:
    """One executor: how it is started, the federation keys it refuses, and the checks of its own keys."""

    name: str
    factory: str
    """`module:attribute` of a callable (fed, root) -> an object with run_round(work)."""
    refuses: tuple[str, ...] = ()
    """Federation settings it does not carry out yet (names of federation_keys_set's keys): a federation
    that sets one is refused, the first one set named."""
    site_keys: tuple[str, ...] = ()
    """Keys of a site that only this executor uses (elsewhere they are refused as unused)."""
    site_files_here: bool = True
    """Whether the sites' run configs and cluster profiles are files on this machine, checked here;
    else they are read at each site (agents)."""
    uses_exchange: bool = False
    """Whether it needs `exchange:`, where the sites and this machine meet (elsewhere it is refused)."""
    site_checks: Callable[[str, SiteLogin], list[str]] = field(default=_no_problems)
    """Problems of one site's keys (where, site) -> lines."""
    checks: Callable[[Any], list[str]] = field(default=_no_problems)
    """Problems of the federation's keys (a schema.FederationConfig) that only this executor reads: the
    files it needs on this machine (`federate --status` lists them as not readable here, refusing nothing)."""
    place: Callable[[Any, Any], str] | None = None
    """How `federate --dry-run` says where a site (fed, site) trains when the executor decides it; None:
    by the site's `where` and `login`."""
    secure_aggregation: bool = False
    """Whether it carries privacy.secure_aggregation: the sites' changes masked at the sites, only their
    sum seen by the coordinator (elsewhere the setting is refused)."""
    dry_run: str = ""
    """`module:attribute` of a callable (fed, plans, root) -> (plan lines, files' texts) that `federate
    --dry-run` adds: what the executor writes for round 1; empty: nothing."""


def _streamflow_checks(fed: Any) -> list[str]:
    from pathlib import Path

    if fed.streamflow.ssh_key and not Path(fed.streamflow.ssh_key).is_file():
        return [
            f"streamflow.ssh_key: {fed.streamflow.ssh_key!r} does not exist; give the private key file for the login nodes, or none (SSH agent)"
        ]
    return []


def _agent_place(fed: Any, site: Any) -> str:
    key = " --key KEYFILE" if fed.privacy.secure_aggregation else ""  # the key --new-key made at the site
    return f"by its agent at the site (supertune federate --site {site.name} {fed.exchange}{key})"


EXECUTORS: dict[str, ExecutorKind] = {
    e.name: e
    for e in (
        ExecutorKind("builtin", factory="supertune.federation.executors.builtin.executor:builtin_executor"),
        ExecutorKind(
            "streamflow",
            factory="supertune.federation.executors.streamflow.executor:StreamFlowExecutor",
            # A StreamFlow step hands back the site's checkpoint, not a transfer package (nor,
            # then, a change clipped and noised at the site: privacy needs transfer.delta).
            refuses=("transfer",),
            site_keys=("login", "workdir", "python"),
            site_checks=streamflow_site_problems,
            checks=_streamflow_checks,
            dry_run="supertune.federation.executors.streamflow.dry_run:dry_run_plan",
        ),
        ExecutorKind(
            "agents",
            factory="supertune.federation.executors.agents.coordinator:AgentsExecutor",
            site_files_here=False,
            uses_exchange=True,
            site_keys=("public_key",),
            place=_agent_place,
            secure_aggregation=True,  # agents/secure_round.py: both masked phases over the exchange
        ),
    )
}


def executor_names() -> list[str]:
    return list(EXECUTORS)


def executor_kind(fed: Any) -> ExecutorKind:
    """The record of a federation's (a schema.FederationConfig's) executor."""
    return EXECUTORS[fed.executor]


def _named(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def start_executor(fed: Any, root: Any) -> Any:
    """The executor of `fed` in its directory `root` (a layout.FederationDir), made by its record's
    factory, which imports its module only now."""
    return _named(executor_kind(fed).factory)(fed, root)


def dry_run_additions(fed: Any, plans: list[Any], root: Any) -> tuple[list[str], list[str]]:
    """What `federate --dry-run` adds for the federation's executor: (plan lines, files' texts)."""
    target = executor_kind(fed).dry_run
    return _named(target)(fed, plans, root) if target else ([], [])
