"""The coordinator's buffer of a buffered federation (mode: buffered, FedBuff): the changes that arrived,
each taken with its staleness and weight, and the global versions published from them.

The record decides. Every change taken is an arrival receipt (numbered in the order they came), and
the versions follow from those receipts alone: the arrivals not dropped, in order, grouped K at a time
(aggregation.buffer_size); version v is the average of group v applied to version v - 1. A change's
staleness u is fixed when it arrives (the newest version then, minus the version it started from) and
it is applied to that newest version: a version is published as soon as its Kth change is recorded,
before another is taken. So a coordinator killed anywhere resumes by publishing, from the receipts,
every version that is due, byte for byte what it would have published, and only then takes new
changes.

A change travels as a transfer package of the site's checkpoint minus the version it started from
(codec same: stored in the weights' own dtype, not quantised), and the average reads the packages
with that change added to the newest version (averaging's `rebase`): the server optimizer of
synchronous rounds, with its state kept beside each version, then moves the global model by the
weighted mean change.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ...checkpoints.faults import fault_point
from ...errors import UserError
from ..config.schema import FederationConfig
from ..config.staleness import staleness_weight
from ..state.layout import FederationDir
from ..state.receipts import read_arrival, read_published, write_arrival, write_published
from ..state.records import Arrival, PublishedVersion, TrainedReceipt
from .phases import server_step
from .site_weight import site_count

__all__ = ["VersionBuffer"]

log = logging.getLogger("supertune")


class VersionBuffer:
    """The arrivals and published versions of a buffered federation, read from its receipts."""

    def __init__(self, fed: FederationConfig, root: FederationDir, base: Path) -> None:
        self.fed, self.root, self.base = fed, root, base
        self.arrivals: list[Arrival] = []
        while (a := read_arrival(root.arrival(len(self.arrivals) + 1))) is not None:
            self.arrivals.append(a)
        self.published = 0
        while self.published < fed.rounds and read_published(root.round(self.published + 1).published) is not None:
            self.published += 1

    @property
    def finished(self) -> bool:
        return self.published >= self.fed.rounds

    def model(self, version: int) -> Path:
        """Global version `version`'s model (0: the base model)."""
        return self.base if version == 0 else self.root.round(version).global_model

    def groups(self) -> list[list[Arrival]]:
        """The arrivals not dropped, in order, K at a time: group v makes version v (the last may be short)."""
        kept = [a for a in self.arrivals if not a.dropped]
        k = self.fed.aggregation.buffer_size
        return [kept[i : i + k] for i in range(0, len(kept), k)]

    def contributed(self, site: str) -> set[int]:
        """The tasks of `site` already taken (arrived, dropped or not)."""
        return {a.task for a in self.arrivals if a.site == site}

    # -- taking a change ---------------------------------------------------------------------------

    def arrive(self, task: int, base_version: int, trained: TrainedReceipt, sent: Path) -> Arrival:
        """Take a site's finished training of its task `task` (from version `base_version`): its change
        packed into `sent`, its arrival recorded, and the next version published when it fills the buffer."""
        a = self.fed.aggregation
        number, version = len(self.arrivals) + 1, self.published
        u = version - base_version
        if u < 0:
            raise UserError(f"{trained.site} task {task}: starts from version {base_version}, not yet published")
        dropped = a.max_staleness is not None and u > a.max_staleness
        weight = 0.0 if dropped else self._count(trained) * staleness_weight(a.staleness.kind, a.staleness.a, a.staleness.b, u)  # fmt: skip
        if not dropped:
            self._pack(trained, task, base_version, sent)
        arrival = Arrival(
            number=number,
            site=trained.site,
            task=task,
            base_version=base_version,
            version=version,
            staleness=u,
            tokens=trained.tokens,
            samples=trained.samples,
            weight=weight,
            dropped=dropped,
            checkpoint=trained.checkpoint,
            sent=None if dropped else str(sent),
            unix=time.time(),
        )
        fault_point("federation.arrival", number, 0)  # the change packed, its receipt not yet written
        write_arrival(self.root.arrival(number), arrival)
        self.arrivals.append(arrival)
        what = (
            f"dropped (staler than aggregation.max_staleness={a.max_staleness})" if dropped else f"weight {weight:,.1f}"
        )
        log.info("arrival %d: %s task %d from version %d onto version %d, staleness %d, %s", number, arrival.site,
                 task, base_version, version, u, what)  # fmt: skip
        self.publish_due()
        return arrival

    def _count(self, trained: TrainedReceipt) -> float:
        """What a change counts before its staleness: the site's fixed weight, or aggregation.weights."""
        count = site_count(self.fed, trained.site, trained.tokens, trained.samples)
        if count is None:
            mode = self.fed.aggregation.weights
            raise UserError(f"{trained.site}: its run counts no {mode}; set aggregation.weights: uniform")
        return count

    def _pack(self, trained: TrainedReceipt, task: int, base_version: int, sent: Path) -> None:
        """The site's change from its starting version, as a transfer package in the weights' own dtype (made once)."""
        from ...averaging.inputs import cached_digest, resolve_input
        from ...transfer import PACKAGE_MANIFEST, Codec, write_package

        if (sent / PACKAGE_MANIFEST).is_file():  # published whole by one rename
            return
        source, base = resolve_input(trained.checkpoint), resolve_input(self.model(base_version))
        write_package(
            sent,
            source.weights,
            Codec("same", self.fed.transfer.block_size),
            base=base.weights,
            base_digest=cached_digest(base.weights),
            side_files=[source.directory / name for name in source.side_files],
            counts={"tokens": source.tokens, "samples": source.samples, "site": trained.site, "task": task},
            label=f"{trained.site} task {task}",
        )

    # -- publishing --------------------------------------------------------------------------------

    def publish_due(self) -> None:
        """Publish every version whose K arrivals are recorded (up to `rounds`), in order."""
        k = self.fed.aggregation.buffer_size
        for number, group in enumerate(self.groups(), start=1):
            if number <= self.published:
                continue
            if len(group) < k or self.finished:
                return
            self._publish(number, group)
            self.published = number

    def _publish(self, number: int, group: list[Arrival]) -> None:
        from ...averaging import average_checkpoints, read_average_manifest

        wrong = [a.number for a in group if a.version != number - 1]
        if wrong:  # the invariant every coordinator keeps; only an edited record breaks it
            raise UserError(
                f"version {number}: arrivals {wrong} were applied to another version, not {number - 1}; "
                f"the arrival receipts in {self.root.arrivals} were changed by hand"
            )
        previous, out = self.model(number - 1), self.root.round(number).global_model
        started = time.time()
        try:
            manifest = read_average_manifest(out)  # published before a kill could write the receipt
        except ValueError:
            log.info("version %d: averaging arrivals %s into %s", number, [a.number for a in group], out)
            manifest = average_checkpoints(
                [str(a.sent) for a in group],
                out,
                weights=[a.weight for a in group],
                dtype=self.fed.aggregation.dtype,
                server=server_step(self.fed, previous),
                minimum_inputs=1,
                delta_base=previous,
                rebase=True,
            )
        fault_point("federation.published", number, 0)  # the version in place, its receipt not yet written
        record = PublishedVersion(
            version=number,
            global_model=str(out),
            previous=str(previous),
            arrivals=[a.number for a in group],
            weights=[float(i["weight"]) for i in manifest.inputs],
            seconds=time.time() - started,
        )
        write_published(self.root.round(number).published, record)
        log.info("version %d of %d published: %s", number, self.fed.rounds, out)
