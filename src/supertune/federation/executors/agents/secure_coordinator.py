"""The coordinator's part of a round of secure aggregation (secure_round.py says the round): it sums
the sites' masked scale uploads and posts the sum with each site's weight, then sums their masked
value uploads, decodes the weighted average change and applies it to the round's global model.

What it holds of one site is that site's two masked uploads (in `round-NNN/<site>/sent/`), uniformly
distributed while one peer of the site keeps its key; what it writes are sums: the shared scales and
the average. The average is applied as the delta path applies the sites' changes: the previous global
model plus the average is written once (`round-NNN/secure-average/`, removed once the global model is
published) and goes through averaging's writer with the server optimizer's step, if any. That costs
one more write and read of the model than the plain delta path, and the model in memory one tensor
at a time.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import numpy as np

from ....checkpoints.faults import fault_point
from ....errors import UserError
from ....exchange import Exchange
from ....file_table import file_table
from ....transfer.secure_sum import pack_bits
from ....transfer.secure_upload import sum_uploads, write_upload
from ....weight_files.dtypes import ITEM_SIZE, narrow
from ....weight_files.shard_writer import PlannedTensor, ShardWriter
from ...config.schema import FederationConfig
from ...rounds.loop import RoundWork
from ...rounds.phases import server_step
from ...rounds.site_weight import site_count
from ...state.receipts import write_receipt
from . import exchange_layout as names
from .secure_round import (
    COORDINATOR,
    SCALE_SUM_FILE,
    SCALES_FILE,
    VALUES_FILE,
    float_tensors,
    read_tensor,
    secure_sum,
    upload_header,
)

__all__ = ["sum_scales", "secure_average", "weight_fractions"]

log = logging.getLogger("supertune")


def weight_fractions(fed: FederationConfig, counts: dict[str, dict]) -> dict[str, float]:
    """Each site's weight over the round's sum, as average_round weighs them: a fixed sites[].weight, else
    aggregation.weights (tokens, samples or uniform) of the counts the sites posted with their scales."""
    raw = {}
    for site, c in counts.items():
        value = site_count(fed, site, c.get("tokens"), c.get("samples"))
        if value is None:
            mode = fed.aggregation.weights
            raise UserError(
                f"site {site}: its scales record on the exchange has no count of {mode} ({c.get(mode)!r}); nothing is averaged"
            )
        raw[site] = value
    total = sum(raw.values())
    if total <= 0:
        raise UserError(f"aggregation.weights: every site's weight is zero ({raw}); nothing is averaged")
    return {site: w / total for site, w in raw.items()}


def _scale_sum_header(
    fed: FederationConfig, number: int, attempt: int, sites: tuple[str, ...], tensors: list[tuple[str, int]]
):
    ss = secure_sum(fed, sites)
    blocks = [(name, ss.blocks(numel)) for name, numel in tensors]
    return upload_header(fed, number, attempt, "scale sum", COORDINATOR, sites, ss.scale_bits, blocks)


def sum_scales(
    fed: FederationConfig, exchange: Exchange, work: RoundWork, attempt: int, records: dict[str, dict]
) -> None:
    """Sum the masked scales of the attempt's set (`records`: each site's scales record) and post the sum
    with the sites' weight fractions (once: a sum already on the exchange is the attempt's)."""
    from ....averaging.inputs import resolve_input

    number, sites = work.number, tuple(sorted(records))
    if exchange.get_json(names.scale_sum_record(number, attempt)) is not None:
        return
    tensors = float_tensors(resolve_input(work.previous).weights)
    ss = secure_sum(fed, sites)
    blocks = [(name, ss.blocks(numel)) for name, numel in tensors]
    paths = {}
    for site in sites:
        sent = work.averaged.parent / site / "sent"  # the site's folder of the round, as its SiteWork's
        exchange.get_tree(names.site_scales_files(site, number, attempt), records[site].get("files") or {}, sent)
        paths[site] = sent / SCALES_FILE
    expected = {s: upload_header(fed, number, attempt, "scales", s, sites, ss.scale_bits, blocks) for s in sites}
    total = sum_uploads(expected, paths)
    fractions = weight_fractions(fed, records)
    out = work.averaged.parent / "secure"
    out.mkdir(parents=True, exist_ok=True)
    packed = {name: pack_bits(total[name], ss.scale_bits) for name, _ in blocks}
    write_upload(out / SCALE_SUM_FILE, _scale_sum_header(fed, number, attempt, sites, tensors), packed)
    files = exchange.put_tree(
        out, names.scale_sum_files(number, attempt), {SCALE_SUM_FILE: file_table(out)[SCALE_SUM_FILE]}
    )
    exchange.put_json(names.scale_sum_record(number, attempt), {"round": number, "attempt": attempt, "sites": list(sites),
                                                                "fractions": fractions, "files": files})  # fmt: skip
    log.info("round %d attempt %d: summed the masked scales of %s; weights %s", number, attempt, ", ".join(sites),
             ", ".join(f"{s} {f:.4f}" for s, f in fractions.items()))  # fmt: skip
    fault_point("secure.summed", number, 0)


def secure_average(fed: FederationConfig, work: RoundWork, sent: dict[str, Path], exchange: Exchange) -> None:
    """The round's global model from the sum of the sites' masked values (in `sent`, each site's
    directory of uploads): the weighted average change decoded and applied, with the round's receipt."""
    from ....averaging import average_checkpoints, read_average_manifest
    from ....averaging.inputs import resolve_input
    from ...state.model_files import weight_bytes

    number, started = work.number, time.time()
    sites = tuple(sorted(sent))
    attempt = int((exchange.get_json(names.secure_set(number)) or {}).get("attempt") or 1)
    record = exchange.get_json(names.scale_sum_record(number, attempt)) or {}
    if tuple(record.get("sites") or ()) != sites:
        raise UserError(f"round {number}: the scales were summed over {record.get('sites')}, not {list(sites)}; "
                        "nothing is averaged")  # fmt: skip
    fractions = {s: float(record["fractions"][s]) for s in sites}
    try:
        read_average_manifest(work.global_model)  # published before a kill could write the receipt
    except ValueError:
        previous = resolve_input(work.previous)
        tensors = float_tensors(previous.weights)
        ss = secure_sum(fed, sites)
        secure = work.averaged.parent / "secure"
        field = sum_uploads({COORDINATOR: _scale_sum_header(fed, number, attempt, sites, tensors)},
                            {COORDINATOR: secure / SCALE_SUM_FILE})  # fmt: skip
        expected = {s: upload_header(fed, number, attempt, "values", s, sites, ss.sum_bits, tensors) for s in sites}
        totals = sum_uploads(expected, {s: sent[s] / VALUES_FILE for s in sites})
        average = {name: ss.decode(totals[name], ss.shared_scales(field[name])) for name, _ in tensors}
        staged = work.averaged.parent / "secure-average"
        _write_moved_model(previous, average, staged)
        average_checkpoints([staged], work.global_model, weights=[1.0], dtype=fed.aggregation.dtype,
                            server=server_step(fed, work.previous), minimum_inputs=1)  # fmt: skip
        shutil.rmtree(staged)
    tokens = {s: (exchange.get_json(names.site_scales_record(s, number, attempt)) or {}).get("tokens") for s in sites}
    write_receipt(work.averaged, {
        "round": number,
        "global_model": str(work.global_model),
        "weights": fractions,
        "tokens": tokens,
        "left_out": dict(work.left_out or {}),
        "sent_bytes": {s: (sent[s] / SCALES_FILE).stat().st_size + (sent[s] / VALUES_FILE).stat().st_size for s in sites},
        "received_bytes": weight_bytes(work.global_model),
        "secure_aggregation": {"sites": list(sites), "attempt": attempt, "codec": fed.transfer.dtype,
                               "sum_bits": secure_sum(fed, sites).sum_bits},
        "seconds": time.time() - started,
    })  # fmt: skip
    log.info("round %d: the masked sum of %s decoded and applied into %s", number, ", ".join(sites), work.global_model)


def _write_moved_model(previous, average: dict[str, np.ndarray], out: Path) -> None:
    """`previous` plus the average change, in each tensor's dtype, with previous's side files, in `out`."""
    weights = previous.weights
    entries = [weights.entry(name) for name in weights.in_file_order()]
    plan = sorted((PlannedTensor(e.name, e.dtype, tuple(e.shape)) for e in entries), key=lambda t: -ITEM_SIZE[t.dtype])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    writer = ShardWriter(out / "model.safetensors", plan)
    for t in plan:
        if t.name not in average:
            writer.write(weights.rows(t.name, 0, t.numel))
            continue
        moved = read_tensor(weights, t.name) + average[t.name]
        values, finite = narrow(moved, t.dtype, np.empty(t.numel, np.uint32), np.empty(t.numel, np.uint16))
        if not finite:
            raise UserError(
                f"tensor {t.name}: the global model plus the average change overflows {t.dtype}; nothing is published"
            )
        writer.write(values)
    writer.finish()
    for name in previous.side_files:
        shutil.copy2(previous.directory / name, out / name)
