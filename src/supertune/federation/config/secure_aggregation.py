"""The checks of `privacy.secure_aggregation` and `sites[].public_key` (docs/federated/privacy.md,
"Secure aggregation"): every problem one line naming the field, before anything is written.

What is refused and why: the masked sum (supertune.transfer.secure_sum) adds blockwise integers, so
it needs the change (transfer.delta) in int8 or int4; a sum of one site is that site's change, so
every round needs two sites (and a quorum of two or more); buffered rounds average changes as they
arrive, one at a time; the site's clipping and noise are not carried into the masked encoding yet; and an executor that does
not carry the masks would send the changes unmasked.
"""

from __future__ import annotations

import importlib.util

from ...transfer.secure_masks import read_public_key
from ...transfer.secure_sum import SECURE_CODECS
from .executors import EXECUTORS, executor_kind
from .schema import FederationConfig

__all__ = ["CRYPTOGRAPHY_PIN", "secure_aggregation_problems", "secure_aggregation_install_problem"]

CRYPTOGRAPHY_PIN = "cryptography==48.0.0"
"""The masks' library, as pinned-requirements.txt pins it (pyproject.toml's extra `privacy`)."""


def secure_aggregation_problems(fed: FederationConfig) -> list[str]:
    """Everything wrong with the pinned public keys and the secure aggregation settings, one line each."""
    p = []
    for i, site in enumerate(fed.sites):
        if site.public_key is None:
            continue
        try:
            read_public_key(site.public_key)
        except ValueError as exc:
            p.append(
                f"sites[{i}] ({site.name}).public_key: {site.public_key!r} {exc}; "
                f"pin what `supertune federate --site {site.name} EXCHANGE --new-key KEYFILE` printed"
            )
    if not fed.privacy.secure_aggregation:
        return p
    carriers = [e.name for e in EXECUTORS.values() if e.secure_aggregation]
    if not executor_kind(fed).secure_aggregation:
        way = f"use executor: {' or '.join(carriers)}" if carriers else "leave it out"
        p.append(
            f"privacy.secure_aggregation: executor {fed.executor} does not mask the sites' changes"
            f"{'' if carriers else ' (no executor does yet)'}; {way}"
        )
    missing = [s.name for s in fed.sites if not s.public_key]
    if missing:
        p.append(
            f"sites[].public_key: privacy.secure_aggregation needs every site's pinned key, missing for "
            f"{', '.join(missing)}; at each site run `supertune federate --site NAME EXCHANGE --new-key KEYFILE` "
            "and pin what it prints"
        )
    if not fed.transfer.delta or fed.transfer.dtype not in SECURE_CODECS:
        p.append(
            "privacy.secure_aggregation: the masked sum adds a change's blockwise integers; "
            "set transfer.delta: true and transfer.dtype: int8 (or int4)"
        )
    if fed.aggregation.min_sites is not None and fed.aggregation.min_sites < 2:
        p.append(
            f"aggregation.min_sites: {fed.aggregation.min_sites} with privacy.secure_aggregation would average one "
            "site's change alone, which the sum is then; set it to 2 or more"
        )
    if fed.privacy.clip_norm is not None or fed.privacy.noise_multiplier:
        p.append(
            "privacy.secure_aggregation: clipping and noise (privacy.clip_norm, noise_multiplier) are not carried "
            "with the masked sum yet; leave them out, or secure_aggregation"
        )
    if fed.mode != "synchronous":
        p.append(f"privacy.secure_aggregation: not supported with mode: {fed.mode} yet; use mode: synchronous")
    lonely = [n for n in range(1, fed.rounds + 1) if sum(s.in_round(n) for s in fed.sites) < 2]
    if lonely and len(fed.sites) >= 2:
        p.append(
            f"privacy.secure_aggregation: round {lonely[0]} has one site (sites[].from_round/until_round), whose "
            "sum is its own change; let two or more sites train in every round"
        )
    return p


def secure_aggregation_install_problem(fed: FederationConfig) -> list[str]:
    """The masks' library missing on this machine, in one line with what to install."""
    if not fed.privacy.secure_aggregation or importlib.util.find_spec("cryptography") is not None:
        return []
    return [
        f"privacy.secure_aggregation: the masks need cryptography, which is not installed here: "
        f"pip install '{CRYPTOGRAPHY_PIN}' (or supertune[privacy])"
    ]
