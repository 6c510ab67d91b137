"""Moving files to and from the exchange so that no reader ever sees half a file and a dropped
connection costs only the bytes not yet sent.

Putting a file `NAME`: its bytes go to `NAME.partial` on the exchange, appended from the size the
partial already has (a transfer killed at 9 GB of 13 resumes at 9 GB); then the exchange host
reports the partial's size and sha256, and only when both are the local file's is it renamed to
`NAME` (one rename: readers see the whole file or none). A partial that is longer than the file, or
whose sha256 differs once complete, is deleted and sent again. Getting a file is the same the other
way round, against the size and sha256 its manifest records: a file on the exchange that does not
match is refused by name, never used.

A dropped connection (ssh's exit code 255, no answer for a minute, fewer bytes than sent) is tried
again after 2, 4, 8, ... seconds (`retries` times), each time from where the partial ended. The log
shows each transfer's progress: bytes, rate and time left, every 10 seconds and at the end.
Names are relative paths made by supertune (round folders, site names checked by the federation's
config), never taken from what the exchange lists.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import UserError
from ..file_table import sha256_file
from .address import ExchangeAddress
from .hosts import Dropped, host_for

__all__ = ["Exchange", "ExchangeUnreachable"]

log = logging.getLogger("supertune")
T = TypeVar("T")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
PARTIAL = ".partial"
LOGGED = 1_000_000
"""Files of at least this many bytes get a line in the log when they arrive (records and configs do not)."""


class ExchangeUnreachable(UserError):
    """The exchange did not answer through every retry of one step: an outage longer than the backoff
    (a VM rebooting, a network down for minutes). Nothing is lost, and a later try may succeed, so a site
    agent's chain of jobs waits and submits its next link instead of ending (agent_chain.py)."""


class _Progress:
    def __init__(self, what: str, total: int, done: int, report: Callable[[str], None], every: float = 10.0) -> None:
        self.what, self.total, self.done, self.report, self.every = what, total, done, report, every
        self.started = self.last = time.monotonic()
        self.moved = 0

    def add(self, n: int) -> None:
        self.done += n
        self.moved += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.report(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = self.moved / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        share = self.done / self.total if self.total else 1.0
        eta = f", about {left:.0f} s left" if self.done < self.total and left != float("inf") else ""
        return (
            f"{self.what}: {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB ({share:.0%}), {rate / 1e6:.2f} MB/s{eta}"
        )


class Exchange:
    """The exchange at `address`: files put and got whole, verified, resumable."""

    def __init__(
        self,
        address: ExchangeAddress,
        retries: int = 4,
        backoff: float = 2.0,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.address = address
        self.retries = retries
        self.backoff = backoff
        self.report = report or log.info
        self.host = host_for(address)

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.host.close()

    def path(self, name: str) -> str:
        """The exchange host's path of `name`, a relative path of plain components."""
        parts = name.split("/")
        if not parts or any(not _NAME.match(p) or p in (".", "..") for p in parts):
            raise ValueError(f"not an exchange name: {name!r}")
        return f"{self.address.path}/{name}"

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        for number in range(self.retries + 1):
            try:
                return attempt()
            except Dropped as exc:
                if number == self.retries:
                    raise ExchangeUnreachable(
                        f"exchange {self.address.text}: {what}: the connection failed {number + 1} times, the last: {exc}; "
                        "check the link (supertune doctor --exchange URL) and run again (a transfer resumes where it stopped)"
                    ) from None
                wait = self.backoff * 2**number
                self.report(f"{what}: the connection dropped ({exc}); trying again in {wait:.0f} s")
                time.sleep(wait)
        raise AssertionError("unreachable")

    def put_file(self, local: Path, name: str, sha256: str | None = None) -> dict:
        """Put `local` as `name`; {size, sha256, sent, seconds}. `sha256`: the local file's, when known."""
        target = self.path(name)
        total = local.stat().st_size
        digest = sha256 or sha256_file(local)
        partial = target + PARTIAL
        self._retrying(f"put {name}", lambda: self.host.makedirs(target.rsplit("/", 1)[0]))
        started = time.monotonic()
        if (
            self._retrying(f"put {name}", lambda: self.host.size(target)) == total
            and self._retrying(f"put {name}", lambda: self.host.sha256(target)) == digest
        ):
            return {"size": total, "sha256": digest, "sent": 0, "seconds": 0.0}  # put whole before (a resumed publish)
        moved = {"bytes": 0}

        def attempt() -> dict:
            have = self.host.size(partial) or 0
            if have > total:
                self.host.remove(partial)
                have = 0
            if have:
                self.report(f"put {name}: resuming at {have / 1e6:.1f} of {total / 1e6:.1f} MB")
            progress = _Progress(f"put {name}", total, have, self.report)
            if have < total:
                self.host.append(partial, _chunks(local, have, progress))
            moved["bytes"] += progress.moved
            arrived = self.host.size(partial)
            if arrived != total:
                raise Dropped(f"{arrived or 0} of {total} bytes arrived")
            if self.host.sha256(partial) != digest:
                self.host.remove(partial)
                raise Dropped("the file arrived with another sha256; sending it again")
            self.host.rename(partial, target)
            if total >= LOGGED:
                self.report(progress.line())
            return {"size": total, "sha256": digest, "sent": moved["bytes"], "seconds": time.monotonic() - started}

        return self._retrying(f"put {name}", attempt)

    def get_file(self, name: str, local: Path, size: int, sha256: str) -> dict:
        """Get `name` into `local`, refused unless it has `size` bytes and `sha256`; {size, sha256, got, seconds}."""
        source = self.path(name)
        partial = local.with_name(local.name + PARTIAL)
        local.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        moved = {"bytes": 0, "restarts": 0}

        def attempt() -> dict:
            have = partial.stat().st_size if partial.is_file() else 0
            if have > size:
                partial.unlink()
                have = 0
            progress = _Progress(f"get {name}", size, have, self.report)
            if have < size:
                with partial.open("ab") as out:

                    def sink(block: bytes) -> None:
                        out.write(block)
                        progress.add(len(block))

                    self.host.read(source, have, sink)
            moved["bytes"] += progress.moved
            got = partial.stat().st_size if partial.is_file() else 0
            if got != size:
                raise Dropped(f"{got} of {size} bytes arrived")
            if sha256_file(partial) != sha256:
                partial.unlink()
                moved["restarts"] += 1
                if moved["restarts"] > 1:
                    raise UserError(
                        f"exchange {self.address.text}: {name} does not match its manifest (sha256) twice; "
                        "the file on the exchange is damaged or was changed: it is not used"
                    )
                raise Dropped("the file arrived with another sha256 than its manifest's; getting it again")
            partial.replace(local)
            if size >= LOGGED:
                self.report(progress.line())
            return {"size": size, "sha256": sha256, "got": moved["bytes"], "seconds": time.monotonic() - started}

        return self._retrying(f"get {name}", attempt)

    def put_json(self, name: str, data: dict) -> None:
        """A small JSON record (a receipt, a manifest), put whole by the same protocol."""
        import json
        import tempfile

        with tempfile.TemporaryDirectory(prefix="supertune-put-") as tmp:
            local = Path(tmp) / "record.json"
            local.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            self.put_file(local, name)

    def get_small(self, name: str, limit: int = 1 << 20) -> bytes | None:
        """A small file whole (a record, the federation config), or None while it is not on the exchange."""

        def attempt() -> bytes | None:
            size = self.host.size(self.path(name))
            if size is None:
                return None
            if size > limit:
                raise UserError(
                    f"exchange {self.address.text}: {name} is {size} bytes, more than a record holds; it is not used"
                )
            chunks: list[bytes] = []
            self.host.read(self.path(name), 0, chunks.append)
            return b"".join(chunks)

        return self._retrying(f"get {name}", attempt)

    def get_json(self, name: str, limit: int = 1 << 20) -> dict | None:
        """A small JSON record, or None while it is not on the exchange; UserError when it is no record."""
        import json

        raw = self.get_small(name, limit)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise UserError(
                f"exchange {self.address.text}: {name} is not a JSON record ({exc}); it is not used"
            ) from None
        if not isinstance(data, dict):
            raise UserError(f"exchange {self.address.text}: {name} is not a JSON object; it is not used")
        return data

    def put_tree(self, local: Path, prefix: str, table: dict[str, dict]) -> dict[str, dict]:
        """Every file of `table` ({relative path: {size, sha256}} of files under `local`: a package's or
        `file_table`'s, so that nothing is hashed twice) put under `prefix`; returns the table."""
        for rel, entry in sorted(table.items()):
            self.path(rel)  # a plain relative name, or ValueError: never a path out of `local`
            self.put_file(local / rel, f"{prefix}/{rel}", sha256=str(entry["sha256"]))
        return table

    def get_tree(self, prefix: str, table: dict[str, dict], local: Path) -> None:
        """Every file of `table` under `prefix` into `local`, each checked against the table's size and sha256."""
        for rel, entry in sorted(table.items()):
            self.path(rel)  # a plain relative name, or ValueError: never a path out of `local`
            target = local / rel
            if target.is_file() and target.stat().st_size == entry["size"] and sha256_file(target) == entry["sha256"]:
                continue
            self.get_file(f"{prefix}/{rel}", target, int(entry["size"]), str(entry["sha256"]))

    def remove(self, name: str) -> None:
        self._retrying(f"remove {name}", lambda: self.host.remove(self.path(name)))

    def ping(self) -> float:
        """Seconds for one command on the exchange host (a round trip once connected)."""
        started = time.monotonic()
        self._retrying("reach the exchange", self.host.ping)
        return time.monotonic() - started


def _chunks(local: Path, offset: int, progress: _Progress, size: int = 1 << 20) -> Iterator[bytes]:
    with local.open("rb") as f:
        f.seek(offset)
        while block := f.read(size):
            progress.add(len(block))
            yield block
