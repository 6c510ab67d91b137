"""`supertune doctor --exchange URL`: how fast this machine reaches a federation's exchange.

It connects (over ssh: the handshake, then a shared connection), times three round trips (one
command each), then puts a probe file of random bytes (`--probe-mb`, 32 MB by default, at most 1 GB)
through the exchange protocol and gets it back (the same verified, resumable transfers a round's
models take), and removes it. What it reports is what a round pays per file: the round trip before
each transfer, and MB/s each way (1 MB = 10^6 bytes), with the time a 1 GB file would take.
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from .address import parse_exchange
from .files import Exchange

__all__ = ["measure_link"]


def measure_link(url: str, probe_bytes: int) -> dict:
    """{url, connect_s, round_trip_s, probe_bytes, upload_mb_s, download_mb_s}; UserError when unreachable."""
    address = parse_exchange(url, option="--exchange")
    quiet: list[str] = []
    with Exchange(address, retries=1, backoff=1.0, report=quiet.append) as exchange:
        connect = exchange.ping()
        trips = [exchange.ping() for _ in range(3)]
        name = f"supertune-doctor-{_plain(socket.gethostname())}-{os.getpid()}"
        with tempfile.TemporaryDirectory(prefix="supertune-link-") as tmp:
            probe = Path(tmp) / "probe"
            with probe.open("wb") as f:
                left = probe_bytes
                while left:
                    block = os.urandom(min(left, 1 << 20))
                    f.write(block)
                    left -= len(block)
            try:
                up = exchange.put_file(probe, f"{name}/probe")
                started = time.monotonic()
                exchange.get_file(f"{name}/probe", Path(tmp) / "back", up["size"], up["sha256"])
                down = time.monotonic() - started
            finally:
                exchange.remove(name)
    return {
        "url": url,
        "connect_s": connect,
        "round_trip_s": statistics.median(trips),
        "probe_bytes": probe_bytes,
        "upload_mb_s": probe_bytes / 1e6 / max(up["seconds"], 1e-9),
        "download_mb_s": probe_bytes / 1e6 / max(down, 1e-9),
    }


def link_text(result: dict) -> str:
    up, down = result["upload_mb_s"], result["download_mb_s"]
    return "\n".join([
        f"exchange {result['url']}",
        f"  connect      {result['connect_s'] * 1000:8.1f} ms (first command, the ssh handshake included)",
        f"  round trip   {result['round_trip_s'] * 1000:8.1f} ms (median of 3 commands)",
        f"  upload       {up:8.2f} MB/s ({result['probe_bytes'] / 1e6:.0f} MB probe; a 1 GB file: {1000 / up:.0f} s)",
        f"  download     {down:8.2f} MB/s (a 1 GB file: {1000 / down:.0f} s)",
    ])  # fmt: skip


def _plain(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:40] or "host"
