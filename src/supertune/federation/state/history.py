"""What happened to a federation besides its receipts: the sites dropped from it and the failures
of its rounds, both kept in its directory and shown by `supertune federate --status`.

    <federation dir>/dropped.json    {site: {"from_round": N, "unix": t}}: sites that do no more work
    <federation dir>/failures.jsonl  one line per failed attempt: round, site (when known), error, time

A site that cannot go on (its cluster is gone, its data withdrawn) is dropped with
`supertune federate DIR --drop SITE`: from the first round not yet averaged it trains, averages and
evaluates no more, and the rounds it took part in stay in the table. federation.yaml is not
changed: the federation stays the one its directory was made for, with one site fewer from then on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...json_lines import read_records
from ...rundir import write_json_atomic
from ..config.schema import FederationConfig
from .layout import FederationDir
from .receipts import read_receipt

__all__ = [
    "dropped_sites",
    "drop_sites",
    "active_federation",
    "first_unfinished_round",
    "round_finished",
    "record_failure",
    "failures",
]

log = logging.getLogger("supertune")


def _dropped_file(root: FederationDir) -> Path:
    return root.path / "dropped.json"


def _failures_file(root: FederationDir) -> Path:
    return root.path / "failures.jsonl"


def dropped_sites(root: FederationDir) -> dict[str, dict[str, Any]]:
    """Site name -> {"from_round": N, "unix": t} for every dropped site."""
    return read_receipt(_dropped_file(root)) or {}


def drop_sites(fed: FederationConfig, root: FederationDir, names: list[str]) -> None:
    """Record `names` as dropped from the first round without an average; refused (one line, nothing
    written) for a name that is no site, a finished federation, or one left with no site. One site left
    goes on alone: each round's global model is then its model (through the averaging's checks, writer
    and server step), so a two-site federation survives a site that fails for good."""
    known = [s.name for s in fed.sites]
    dropped = dropped_sites(root)
    for name in names:
        if name not in known:
            raise UserError(f"--drop: {name!r} is not a site of this federation; its sites are {', '.join(known)}")
    if round_finished(root, fed.rounds):
        raise UserError(
            f"--drop: the federation in {root.path} has finished all its {fed.rounds} rounds; nothing is left to drop a site from"
        )
    new = [n for n in dict.fromkeys(names) if n not in dropped]
    left = [n for n in known if n not in dropped and n not in new]
    start = first_unfinished_round(fed, root)
    if not left:
        raise UserError(
            f"--drop: {', '.join(new or names)} would leave no site; a federation needs one site still training "
            f"(drop all but one, and the rounds go on with that site alone)"
        )
    for name in new:
        dropped[name] = {"from_round": start, "unix": time.time()}
        log.warning("site %s: dropped from round %d on; its earlier rounds stay in the table", name, start)
    write_json_atomic(_dropped_file(root), dropped)


def active_federation(fed: FederationConfig, root: FederationDir) -> FederationConfig:
    """The federation without its dropped sites: what the rounds still to run are made of."""
    dropped = dropped_sites(root)
    if not dropped:
        return fed
    return dataclasses.replace(fed, sites=[s for s in fed.sites if s.name not in dropped])


def round_finished(root: FederationDir, number: int) -> bool:
    """Whether round `number` has its average recorded: averaged.json of a synchronous round, or
    published.json of a buffered federation's version `number` (each mode writes only its own)."""
    rd = root.round(number)
    return read_receipt(rd.averaged) is not None or read_receipt(rd.published) is not None


def first_unfinished_round(fed: FederationConfig, root: FederationDir) -> int:
    """The first round (or buffered version) without its average (round 0 while the base model's
    evaluations are missing is not told apart)."""
    return next((n for n in range(1, fed.rounds + 1) if not round_finished(root, n)), fed.rounds)


def record_failure(fed: FederationConfig, root: FederationDir, number: int, error: str) -> None:
    """Append a failed attempt of round `number`; the site is the one the error names first, in
    the spellings the federation's messages use ("S round N:", "site S:", "sites[i] (S):")."""
    named = {}
    for i, s in enumerate(fed.sites):
        found = [error.find(m) for m in (f"{s.name} round {number}", f"site {s.name}:", f"sites[{i}] ({s.name})")]
        found = [at for at in found if at >= 0]
        if found:
            named[s.name] = min(found)
    site = min(named, key=lambda name: named[name]) if named else None
    record = {"round": number, "site": site, "error": error, "unix": time.time()}
    with _failures_file(root).open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def failures(root: FederationDir) -> list[dict[str, Any]]:
    """Every recorded failure, oldest first; a line cut short by a kill is left out."""
    return read_records(_failures_file(root))
