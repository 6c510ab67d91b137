"""A site agent's part of a round of secure aggregation (secure_round.py says the round): its key posted
and its peers' keys checked against the pinned ones, then its change sent only masked, in two uploads.

The change (the trained checkpoint minus the round's global model) is read one tensor at a time and
read twice, once per phase: a tensor in memory at a time, one read of both models more than one pass
would cost. The masked uploads are built whole in memory before they are written (the values phase:
(b + c) / 8 bytes a value, 1.25 bytes for int8 and 4 sites). The unmasked change is never written,
here or at the exchange; nor is a residual: secure aggregation carries no error feedback yet.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ....checkpoints.faults import fault_point
from ....errors import UserError
from ....exchange import Exchange
from ....file_table import file_table
from ....transfer.secure_masks import PairMasks, public_key_text, read_public_key
from ....transfer.secure_sum import pack_bits
from ....transfer.secure_upload import sum_uploads, write_upload
from ...config.schema import FederationConfig
from . import exchange_layout as names
from .exchange_wait import wait_at_exchange
from .secure_round import (
    COORDINATOR,
    SCALE_SUM_FILE,
    SCALES_FILE,
    VALUES_FILE,
    float_tensors,
    mask_context,
    read_tensor,
    secure_sum,
    upload_header,
)

__all__ = ["post_key", "peer_keys", "current_set", "send_masked"]

log = logging.getLogger("supertune")


def post_key(exchange: Exchange, site: str, number: int, private_key: bytes) -> None:
    """This site's public key for round `number` on the exchange (once)."""
    if exchange.get_json(names.site_key(site, number)) is None:
        exchange.put_json(names.site_key(site, number), {"round": number, "public_key": public_key_text(private_key)})


def peer_keys(
    exchange: Exchange, fed: FederationConfig, site: str, number: int, sites: tuple[str, ...], poll_seconds: float
) -> dict[str, bytes]:
    """Every peer's public key as posted for round `number`, each checked against the key the federation
    pins for it; UserError in one line naming the first site whose posted key is not its pinned one."""
    pinned = {s.name: (s.public_key or "").strip() for s in fed.sites}
    pending = [p for p in sites if p != site]
    got: dict[str, bytes] = {}

    def ask() -> bool | None:
        for peer in list(pending):
            record = exchange.get_json(names.site_key(peer, number))
            if record is None:
                continue
            posted = str(record.get("public_key") or "").strip()
            if posted != pinned[peer]:
                raise UserError(
                    f"sites ({peer}).public_key: the key posted for site {peer} in round {number} is {posted or 'empty'}, "
                    f"not the pinned {pinned[peer]}; nothing is masked or sent (check the exchange and the federation config)"
                )
            got[peer] = read_public_key(posted)
            pending.remove(peer)
        return True if not pending else None

    wait_at_exchange(ask, poll_seconds, lambda: f"the keys of {', '.join(pending)} for round {number} (site {site})")
    return got


def current_set(exchange: Exchange, number: int) -> dict | None:
    """The coordinator's set of round `number`'s secure sum: {round, attempt, sites}, or None before it is set."""
    return exchange.get_json(names.secure_set(number))


def send_masked(
    exchange: Exchange,
    fed: FederationConfig,
    site: str,
    number: int,
    attempt: int,
    sites: tuple[str, ...],
    private_key: bytes,
    peers: dict[str, bytes],
    checkpoint: Path,
    previous: Path,
    counts: dict,
    out: Path,
) -> Path | None:
    """Both masked uploads of this site's change from `previous` to `checkpoint` for `attempt` of the
    round's sum over `sites`, written under `out` and put on the exchange (the scales, then, once the
    coordinator has summed them, the values, which the caller puts with its record); returns the
    values' directory, or None when the coordinator set a later attempt meanwhile (a site of the set
    failed). `counts`: the site's tokens and samples."""
    from ....averaging.inputs import resolve_input

    source, base = resolve_input(checkpoint).weights, resolve_input(previous).weights
    tensors = float_tensors(base)
    ss = secure_sum(fed, sites)
    masks = PairMasks(
        site, private_key, {p: k for p, k in peers.items() if p in sites}, mask_context(fed, number, attempt)
    )
    blocks = [(name, ss.blocks(numel)) for name, numel in tensors]
    out = out / f"attempt-{attempt}"

    def change(name: str) -> np.ndarray:
        x = read_tensor(source, name) - read_tensor(base, name)
        if not np.isfinite(x).all():
            raise UserError(f"{site} round {number}: tensor {name} of its change has NaN or Inf values; it is not sent")
        return x

    # phase 1: the block scales
    scales_dir = out / "scales"
    if exchange.get_json(names.site_scales_record(site, number, attempt)) is None:
        packed = {}
        for name, _ in tensors:
            field = ss.scale_field(change(name))
            packed[name] = pack_bits(masks.apply(field, f"{name}:scales", 0, ss.scale_bits), ss.scale_bits)
        scales_dir.mkdir(parents=True, exist_ok=True)
        header = upload_header(fed, number, attempt, "scales", site, sites, ss.scale_bits, blocks)
        write_upload(scales_dir / SCALES_FILE, header, packed)
        files = exchange.put_tree(scales_dir, names.site_scales_files(site, number, attempt), file_table(scales_dir))
        exchange.put_json(names.site_scales_record(site, number, attempt),
                          {"round": number, "attempt": attempt, "files": files, **counts})  # fmt: skip
        log.info("site %s round %d attempt %d: sent its masked block scales (%d bytes)", site, number, attempt,
                 (scales_dir / SCALES_FILE).stat().st_size)  # fmt: skip
        fault_point("secure.scales", number, 0)

    # the coordinator's sum of the set's scales (the shared scales, and this site's weight), or a later attempt
    def ask() -> dict | None:
        record = exchange.get_json(names.scale_sum_record(number, attempt))
        if record is None and int((current_set(exchange, number) or {}).get("attempt") or 0) > attempt:
            return {}
        return record

    record = wait_at_exchange(ask, fed.poll_seconds, lambda: f"the sum of round {number}'s scales (site {site})")
    if not record:
        log.warning("site %s round %d: the coordinator set attempt %d's set anew (a site of it failed); masking "
                    "again", site, number, attempt)  # fmt: skip
        return None
    if tuple(record.get("sites") or ()) != sites:
        raise UserError(
            f"exchange: {names.scale_sum_record(number, attempt)} sums the scales of {record.get('sites')}, not "
            f"{list(sites)}; nothing is sent"
        )
    summed = out / "scale-sum"
    exchange.get_tree(names.scale_sum_files(number, attempt), record.get("files") or {}, summed)
    expected = upload_header(fed, number, attempt, "scale sum", COORDINATOR, sites, ss.scale_bits, blocks)
    field = sum_uploads({COORDINATOR: expected}, {COORDINATOR: summed / SCALE_SUM_FILE})
    fraction = float(record["fractions"][site])
    # phase 2: the values, on the shared scales
    values_dir = out / "values"
    values_dir.mkdir(parents=True, exist_ok=True)
    packed, clipped = {}, 0
    for name, _ in tensors:
        q, n = ss.encode(change(name), ss.shared_scales(field[name]), fraction)
        clipped += n
        packed[name] = pack_bits(masks.apply(q, f"{name}:values", 0, ss.sum_bits), ss.sum_bits)
    header = upload_header(fed, number, attempt, "values", site, sites, ss.sum_bits, tensors)
    write_upload(values_dir / VALUES_FILE, header, packed)
    log.info("site %s round %d attempt %d: its change masked on the shared scales at weight %.4f (%d values "
             "clipped to the shared range)", site, number, attempt, fraction, clipped)  # fmt: skip
    return values_dir
