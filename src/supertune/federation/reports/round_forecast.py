"""`supertune federate FEDERATION --plan --link LINK.json`: how long each round still to run should
take, from a measured link to the exchange, and which part of a round dominates.

LINK.json is what `supertune doctor --exchange URL --out LINK.json` wrote: the round trip and the
upload and download rates of a probe file through the exchange's protocol. Per round and site:

- train: the site's seconds per step in the rounds it has run (its training receipts' wall time,
  start-up included, over its steps) times its steps; unknown before its first round (`-`);
- upload: the bytes it sends (the cost plan's: its model, adapter or transfer package) at the
  measured upload rate, plus 6 round trips (the protocol's commands: folder, size, append, size,
  sha256, rename);
- wait: until the slowest site of the round has trained and uploaded (sites train in parallel, each
  at its own site), then the average (its measured seconds, else 0);
- download: the global model at the download rate, plus 6 round trips.

A round takes the slowest site's train + upload, the average, then the download. The part that
dominates the rounds' sum is named with what shortens it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from ..config.schema import FederationConfig

__all__ = ["Link", "PlannedRow", "read_link", "forecast_lines"]

COMMANDS_PER_FILE = 6


@dataclass(frozen=True)
class Link:
    url: str
    round_trip_s: float
    upload_mb_s: float
    download_mb_s: float
    source: str


@dataclass(frozen=True)
class PlannedRow:
    round: int
    site: str
    steps: int
    sent: int
    received: int
    seconds_per_step: float | None


def read_link(path: str) -> Link:
    """The measurement `supertune doctor --exchange URL --out FILE` wrote; UserError naming --link otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        link = Link(
            url=str(data["url"]),
            round_trip_s=float(data["round_trip_s"]),
            upload_mb_s=float(data["upload_mb_s"]),
            download_mb_s=float(data["download_mb_s"]),
            source=str(path),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"--link: {path!r} is not a link measurement ({exc}); write one with `supertune doctor --exchange URL --out FILE`"
        ) from None
    values = (link.round_trip_s, link.upload_mb_s, link.download_mb_s)
    if not all(math.isfinite(v) and v >= 0 for v in values) or not (link.upload_mb_s > 0 and link.download_mb_s > 0):
        raise UserError(f"--link: {path!r} holds rates that are not positive numbers; measure the link again")
    return link


def forecast_lines(fed: FederationConfig, rows: list[PlannedRow], link: Link, average_s: float) -> list[str]:
    up_rate, down_rate = link.upload_mb_s * 1e6, link.download_mb_s * 1e6
    overhead = COMMANDS_PER_FILE * link.round_trip_s
    lines = [
        "",
        f"# time per round with the link in {link.source} ({link.url}: up {link.upload_mb_s:.2f} MB/s, down "
        f"{link.download_mb_s:.2f} MB/s, round trip {link.round_trip_s * 1000:.0f} ms); sites train in parallel, each at its own site",
        "",
        "| round | site | train s | upload s | wait s | download s |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    parts = {"train": 0.0, "upload": 0.0, "download": 0.0}
    unknown = sorted({r.site for r in rows if r.seconds_per_step is None})
    total = 0.0
    for number in sorted({r.round for r in rows}):
        these = [r for r in rows if r.round == number]
        train = {r.site: (r.seconds_per_step * r.steps if r.seconds_per_step is not None else 0.0) for r in these}
        up = {r.site: r.sent / up_rate + overhead for r in these}
        down = {r.site: r.received / down_rate + overhead for r in these}
        slowest = max(these, key=lambda r: train[r.site] + up[r.site])
        ready = train[slowest.site] + up[slowest.site] + average_s
        for r in these:
            shown = f"{train[r.site]:.0f}" if r.seconds_per_step is not None else "-"
            wait = ready - train[r.site] - up[r.site]
            lines.append(f"| {number} | {r.site} | {shown} | {up[r.site]:.1f} | {wait:.1f} | {down[r.site]:.1f} |")
        parts["train"] += train[slowest.site]
        parts["upload"] += up[slowest.site]
        parts["download"] += max(down.values())
        total += ready + max(down.values())
    if not rows:
        return lines + ["", "no round left to run"]
    main = max(parts, key=lambda k: parts[k])
    share = ", ".join(f"{k} {v / total:.0%}" for k, v in parts.items()) if total else "nothing to move"
    lines += [
        "",
        f"rounds left: about {total:,.0f} s ({share}; the average {average_s:.0f} s a round)"
        + (f"; without the training of {', '.join(unknown)}: no round of theirs to measure yet" if unknown else ""),
        f"dominant: {main}; {_suggestion(fed, main)}",
    ]
    return lines


def _suggestion(fed: FederationConfig, part: str) -> str:
    t = fed.transfer
    if part == "train":
        return "the link is not what a round waits for: more nodes at the slowest site, or fewer steps per round, shorten it"
    if part == "download" and fed.executor == "agents":
        return (
            "the global model comes down whole every round (to agents LoRA sites too: aggregation.lora: merged); "
            "more local steps per round mean fewer rounds"
        )
    if part == "download":
        return (
            "the global model comes down whole every round: LoRA sites (aggregation.lora: adapters) move only adapters, "
            "and more local steps per round mean fewer rounds"
        )
    if not t.delta:
        return (
            "send less: transfer: {delta: true, dtype: int8} sends about 27 % of a float32 model's bytes (int4: about 15 %), "
            "or train LoRA adapters; more local steps per round mean fewer uploads"
        )
    if t.dtype != "int4":
        return "send less: transfer.dtype: int4 halves int8's bytes (error feedback keeps what it rounds away); or LoRA adapters"
    return (
        "the smallest encoding is in use: LoRA adapters, or more local steps per round (fewer rounds), move fewer bytes"
    )
