"""Reading a federation config: the YAML, typed and checked all at once, and every site's run config
resolved up front, so that a mistake at the third site is found before the first site trains.

Paths in the file (site configs, the base model) are relative to the file; they are made absolute,
and the federation directory keeps the loaded config (federation.yaml), so it resumes from anywhere.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from ...config.build import build_config
from ...config.errors import ConfigError
from ...config.yaml_file import read_yaml_mapping
from ...errors import UserError
from .executors import EXECUTORS, executor_kind
from .schema import FederationConfig

__all__ = [
    "load_federation",
    "federation_problems",
    "server_defaults",
    "federation_text",
    "federation_keys_set",
    "FEDERATION_FILE",
    "SITE_NAME",
]

FEDERATION_FILE = "federation.yaml"
"""The loaded config in a federation directory (layout.FederationDir.config), from which it resumes."""
SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\Z")
_SITE_KEYS = ("login", "workdir", "python", "public_key")
"""Keys of a site that some executors use (ExecutorKind.site_keys) and the others refuse."""


def load_federation(
    path: str | os.PathLike[str] | None, unreadable: list[str] | None = None
) -> tuple[FederationConfig, Path | None]:
    """(config, the directory it was loaded from: a federation directory to resume, else None).

    `path` is a federation YAML, a federation directory (its federation.yaml), or None for the
    embedded default federation. With `unreadable` (a reader of the receipts, `--status`), what this
    machine lacks (a site's run config, a cluster profile, an SSH key: needed to run the rounds, not
    to read them) is appended there, one line each, instead of refusing the federation.
    """
    if path is None:
        from .default import default_federation

        fed = default_federation()
        server_defaults(fed)
        return fed, None
    p = Path(path).expanduser()
    resumed = None
    if p.is_dir():
        if not (p / FEDERATION_FILE).is_file():
            raise UserError(
                f"FEDERATION: {str(p)!r} is a directory without federation.yaml; give a federation YAML or a federation directory"
            )
        resumed, p = p.absolute(), p / FEDERATION_FILE
    elif not p.exists():  # anything else that is not a file (a FIFO, a socket) is named by read_yaml_mapping
        raise UserError(
            f"FEDERATION: {str(p)!r} does not exist; give a federation YAML (docs/federated.md) or a federation directory"
        )
    data = read_yaml_mapping(p, "federation config", "keys (name:, rounds:, sites:, ...)")
    fed = build_config(FederationConfig, data)
    server_defaults(fed)
    _absolute_paths(fed, p.absolute().parent)
    problems = federation_problems(fed, unreadable)
    if problems:
        raise ConfigError(problems)
    return fed, resumed


def server_defaults(fed: FederationConfig) -> None:
    """Fill in the server learning rate and momentum left empty with the server optimizer's defaults, so
    that the federation's directory records the numbers used (a federation written before
    server_optimizer existed, which recorded 1.0 and 0.0, reads as the same settings)."""
    from ...averaging import default_lr, default_momentum

    a = fed.aggregation
    if a.server_lr is None:
        a.server_lr = default_lr(a.server_optimizer)
    if a.server_momentum is None:
        a.server_momentum = default_momentum(a.server_optimizer)


def _absolute_paths(fed: FederationConfig, base: Path) -> None:
    def absolute(ref: str) -> str:
        expanded = Path(ref).expanduser()
        return str(expanded if expanded.is_absolute() else (base / expanded).absolute())

    for site in fed.sites:
        if site.config and executor_kind(fed).site_files_here:  # else a path at its site
            site.config = absolute(site.config)
    if fed.streamflow.ssh_key:
        fed.streamflow.ssh_key = absolute(fed.streamflow.ssh_key)
    if fed.base_model and (fed.base_model.startswith((".", "/", "~")) or (base / fed.base_model).exists()):
        fed.base_model = absolute(fed.base_model)


MAX_ROUNDS = 10_000
"""More rounds than any federation runs; a bound before every round is walked."""


def federation_problems(fed: FederationConfig, unreadable: list[str] | None = None) -> list[str]:
    """Everything wrong with the federation's own settings, one line each (the sites' run configs are
    checked by `federation.sites.resolve_sites`). With `unreadable`, the files this machine lacks (a
    site's run config, a cluster profile, streamflow.ssh_key) go there instead."""
    p: list[str] = []
    here = p if unreadable is None else unreadable
    kind = executor_kind(fed)
    if not SITE_NAME.match(fed.name):
        p.append(f"name: {fed.name!r} cannot name the federation's folder and jobs; use letters, digits, '-' and '_'")
    if fed.rounds < 1:
        p.append(f"rounds: must be at least 1, got {fed.rounds}")
    elif fed.rounds > MAX_ROUNDS:
        # Checks and tables walk every round: 10^12 of them (a typo, a damaged federation.yaml) would
        # run for hours before anything else is said.
        p.append(f"rounds: at most {MAX_ROUNDS} (each round is a folder and a row of the table), got {fed.rounds}")
    if any(not t.strip() or "," in t for t in fed.benchmarks):
        p.append(f"benchmarks: {fed.benchmarks!r} holds an empty name or a comma; give a list, e.g. [supertune_corpus]")
    if fed.poll_seconds < 1 or not math.isfinite(fed.poll_seconds):
        p.append(f"poll_seconds: must be at least 1 (a scheduler is not asked more often), got {fed.poll_seconds}")
    a = fed.aggregation
    if a.server_lr is not None and not (math.isfinite(a.server_lr) and a.server_lr > 0):
        p.append(f"aggregation.server_lr: must be a positive number (1 is plain FedAvg), got {a.server_lr}")
    if a.server_momentum is not None and not (math.isfinite(a.server_momentum) and 0 <= a.server_momentum < 1):
        p.append(
            f"aggregation.server_momentum: must be in [0, 1) (0.9 is usual; 0 keeps none), got {a.server_momentum}"
        )
    if not (math.isfinite(a.server_beta2) and 0 <= a.server_beta2 < 1):
        p.append(f"aggregation.server_beta2: must be in [0, 1) (0.99 is usual), got {a.server_beta2}")
    if not (math.isfinite(a.server_tau) and a.server_tau > 0):
        p.append(f"aggregation.server_tau: must be a positive number (1e-3 is usual), got {a.server_tau}")
    if 1 <= fed.rounds <= MAX_ROUNDS:  # it walks every round
        p += _participation_problems(fed)
    p += _transfer_problems(fed)
    p += _exchange_problems(fed)
    p += _executor_problems(fed)
    from .buffered import buffered_problems
    from .privacy import privacy_install_problem, privacy_problems
    from .secure_aggregation import secure_aggregation_install_problem, secure_aggregation_problems

    p += buffered_problems(fed)
    p += privacy_problems(fed)
    here += privacy_install_problem(fed)
    if 1 <= fed.rounds <= MAX_ROUNDS:  # it walks every round
        p += secure_aggregation_problems(fed)
    here += secure_aggregation_install_problem(fed)
    if fed.streamflow.polling_seconds < 1:
        p.append(f"streamflow.polling_seconds: must be at least 1, got {fed.streamflow.polling_seconds}")
    if len(fed.sites) < 2:
        p.append(f"sites: a federation needs two or more sites, got {len(fed.sites)}")
    seen: set[str] = set()
    for i, site in enumerate(fed.sites):
        where = f"sites[{i}]" + (f" ({site.name})" if site.name else "")
        if not SITE_NAME.match(site.name):
            p.append(f"{where}.name: {site.name!r} must be a short name of letters, digits, '-' and '_', e.g. leonardo")
        elif site.name in seen:
            p.append(f"{where}.name: {site.name!r} is used by another site; give each site its own name")
        seen.add(site.name)
        if site.steps_per_round < 1:
            p.append(f"{where}.steps_per_round: must be at least 1, got {site.steps_per_round}")
        if site.config and kind.site_files_here and not Path(site.config).is_file():
            state = "is not a regular file" if Path(site.config).exists() else "does not exist"
            here.append(f"{where}.config: {site.config!r} {state}; give the site's run config YAML")
        if site.weight is not None and not (math.isfinite(site.weight) and site.weight > 0):
            p.append(f"{where}.weight: must be a positive number, got {site.weight}")
        for key in _SITE_KEYS:
            if getattr(site, key) and key not in kind.site_keys:
                users = " or ".join(f"executor: {e.name}" for e in EXECUTORS.values() if key in e.site_keys)
                p.append(f"{where}.{key}: only used with {users}; remove it or set {users}")
        p += kind.site_checks(where, site)
        if site.where != "local" and kind.site_files_here:  # else its profile is at its site
            here += _cluster_problem(where, site.where)
    here += kind.checks(fed)
    weighted = [s.weight is not None for s in fed.sites]
    if any(weighted) and not all(weighted):
        p.append(
            "sites[].weight: given for some sites only; give every site a weight, or none (aggregation.weights decides)"
        )
    return p


def _participation_problems(fed: FederationConfig) -> list[str]:
    """Which sites train in which round (from_round, until_round), the quorum and the retries."""
    p: list[str] = []
    a = fed.aggregation
    if fed.site_retries < 0:
        p.append(f"site_retries: must be 0 or more, got {fed.site_retries}")
    if a.min_sites is not None and a.min_sites < 1:
        p.append(f"aggregation.min_sites: must be at least 1 (or empty: every site of the round), got {a.min_sites}")
    from .durations import deadline_problem

    late = deadline_problem(fed.round_deadline)
    if late:
        p.append(late)
    for i, site in enumerate(fed.sites):
        where = f"sites[{i}]" + (f" ({site.name})" if site.name else "")
        if not 1 <= site.from_round <= max(fed.rounds, 1):
            p.append(f"{where}.from_round: must be a round from 1 to rounds={fed.rounds}, got {site.from_round}")
        elif site.until_round is not None and site.until_round < site.from_round:
            p.append(
                f"{where}.until_round: {site.until_round} is before from_round={site.from_round}; give a later round, or none (the last)"
            )
    if p or len(fed.sites) < 2:
        return p
    for number in range(1, fed.rounds + 1):
        sites = sum(s.in_round(number) for s in fed.sites)
        if sites == 0:
            p.append(f"sites[].from_round/until_round: no site trains in round {number}; every round needs a site")
            break
        if a.min_sites is not None and sites < a.min_sites:
            p.append(
                f"aggregation.min_sites: {a.min_sites}, but round {number} has {sites} site{'s' if sites != 1 else ''} "
                "(sites[].from_round/until_round); lower it, or let more sites take part in that round"
            )
            break
    return p


def federation_keys_set(fed: FederationConfig) -> dict[str, bool]:
    """The settings an executor may refuse (ExecutorKind.refuses), and whether the federation sets each."""
    return {
        "aggregation.min_sites": fed.aggregation.min_sites is not None,
        "site_retries": fed.site_retries > 0,
        "round_deadline": bool(fed.round_deadline),
        "transfer": fed.transfer.active,
        "benchmarks": bool(fed.benchmarks),
    }


def _executor_problems(fed: FederationConfig) -> list[str]:
    used = federation_keys_set(fed)
    keys = [k for k in executor_kind(fed).refuses if used[k]]
    return (
        [f"{keys[0]}: not supported with executor: {fed.executor} yet; leave it out, or use executor: builtin"]
        if keys
        else []
    )


def _exchange_problems(fed: FederationConfig) -> list[str]:
    kind = executor_kind(fed)
    if kind.uses_exchange and not fed.exchange:
        return [
            f"exchange: executor: {fed.executor} needs the exchange the sites meet at: a directory or ssh://[user@]host[:port]/path"
        ]
    if fed.exchange and not kind.uses_exchange:
        users = " or ".join(f"executor: {e.name}" for e in EXECUTORS.values() if e.uses_exchange)
        return [f"exchange: only used with {users}; remove it or set {users}"]
    if fed.exchange:
        from ...exchange import parse_exchange

        try:
            parse_exchange(fed.exchange)
        except UserError as exc:
            return [str(exc)]
    return []


def _transfer_problems(fed: FederationConfig) -> list[str]:
    t, p = fed.transfer, []
    if not (8 <= t.block_size <= 65536 and t.block_size % 8 == 0):
        p.append(f"transfer.block_size: must be a multiple of 8 from 8 to 65536 (64 is usual), got {t.block_size}")
    if t.dtype in ("int8", "int4") and not t.delta:
        p.append(
            f"transfer.dtype: {t.dtype} quantises a change, not a model (weights lose too much in {t.dtype[3:]} bits); "
            "set transfer.delta: true"
        )
    if t.delta and fed.aggregation.lora == "merged":
        p.append(
            "transfer.delta: with aggregation.lora: merged every round starts a fresh adapter, so there is no change to send; "
            "use aggregation.lora: adapters, or transfer.delta: false"
        )
    return p


def _cluster_problem(where: str, name: str) -> list[str]:
    from ...clusters import ProfileError, load_profile

    try:
        load_profile(name, what=f"{where}.where")
    except ProfileError as exc:
        return exc.problems
    except UserError as exc:
        return [f"{exc} (or local)"]
    return []


def federation_text(fed: FederationConfig) -> str:
    """The YAML of a loaded federation (absolute paths), kept in its directory."""
    import dataclasses

    import yaml

    data: dict[str, Any] = dataclasses.asdict(fed)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
