"""The typed records a federation keeps per site and round: a finished training (`trained.json`, and the
`trained-<site>.json` a StreamFlow step hands out), a failed training as a step reports it, and the
attempts of a site's training (`cost.json`); in buffered rounds, a site's task, every arrival and every
published version. Each is a dataclass with the JSON it has always been
(`as_json`, key for key and in the same order, so that directories made before these types resume as
they are) and the fields receipts.py checks when it writes one as when it reads one back.

Built from what was read (`from_json`) only after receipts.py found its fields sound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...state_records import Field

__all__ = [
    "TrainedReceipt",
    "FailedTraining",
    "LeftOut",
    "Attempt",
    "BufferedTask",
    "Arrival",
    "PublishedVersion",
    "TRAINED_FIELDS",
    "TASK_FIELDS",
    "ARRIVAL_FIELDS",
    "PUBLISHED_FIELDS",
    "FAILED_TRAINING_FIELDS",
    "ATTEMPT_FIELDS",
    "RUNNING",
]

RUNNING = "running"
"""The outcome of an attempt whose end is not recorded yet."""

TRAINED_FIELDS = {
    "site": Field("str"),
    "round": Field("int"),
    "run": Field("str"),
    "checkpoint": Field("str"),
    "step": Field("int"),
    "tokens": Field("int"),
    "loss_tokens": Field("int", null=True, required=False),
    "samples": Field("int", null=True),
    "eval_loss": Field("number", null=True),
    "seconds": Field("number", required=False),
}
FAILED_TRAINING_FIELDS = {"site": Field("str"), "round": Field("int"), "failed": Field("str")}
LEFT_OUT_FIELDS = {
    "site": Field("str", required=False),
    "round": Field("int", required=False),
    "reason": Field("str"),
    "attempts": Field("int", least=0),
    "unix": Field("number", required=False),
}
"""Site and round are optional: receipts written by hand (--skip-site's first versions) lack them."""
ATTEMPT_FIELDS = {
    "job": Field("str", null=True, required=False),
    "nodes": Field("int", null=True, required=False),
    "processes": Field("int", required=False),
    "submit": Field("number", null=True, required=False),
    "start": Field("number", null=True, required=False),
    "end": Field("number", null=True, required=False),
    "outcome": Field("str"),
}
"""Only the outcome is required: what a missing time or node count costs is nothing (cost.py)."""
TASK_FIELDS = {"site": Field("str"), "task": Field("int", least=1), "base_version": Field("int", least=0)}
ARRIVAL_FIELDS = {
    "number": Field("int", least=1),
    "site": Field("str"),
    "task": Field("int", least=1),
    "base_version": Field("int", least=0),
    "version": Field("int", least=0),
    "staleness": Field("int", least=0),
    "tokens": Field("int", least=0),
    "samples": Field("int", null=True),
    "weight": Field("number"),
    "dropped": Field("bool"),
    "checkpoint": Field("str"),
    "sent": Field("str", null=True),
    "unix": Field("number"),
}
PUBLISHED_FIELDS = {
    "version": Field("int", least=1),
    "global_model": Field("str"),
    "previous": Field("str"),
    "arrivals": Field("list"),
    "weights": Field("list"),
    "seconds": Field("number"),
}


@dataclass(frozen=True)
class TrainedReceipt:
    """A site's finished training of a round: the checkpoint (or, from a site agent, the transfer
    package) the average reads, and what the round table shows of it."""

    site: str
    round: int
    run: str
    """The run directory; `(at the site, PATH)` for a site whose run only its agent can see."""
    checkpoint: str
    step: int
    tokens: int
    loss_tokens: int | None
    """None in receipts written before it was kept, and for runs that do not count it."""
    samples: int | None
    eval_loss: float | None
    seconds: float
    """Wall time of the run (0 when unknown)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "round": self.round,
            "run": self.run,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "samples": self.samples,
            "eval_loss": self.eval_loss,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainedReceipt:
        """From a record whose fields match TRAINED_FIELDS (the optional ones as older receipts lack them)."""
        return cls(
            site=data["site"],
            round=data["round"],
            run=data["run"],
            checkpoint=data["checkpoint"],
            step=data["step"],
            tokens=data["tokens"],
            loss_tokens=data.get("loss_tokens"),
            samples=data["samples"],
            eval_loss=data["eval_loss"],
            seconds=data.get("seconds", 0.0),
        )


@dataclass(frozen=True)
class FailedTraining:
    """A StreamFlow train step's report that its site's training failed (`trained-<site>.json`, where a
    finished one's receipt would be): StreamFlow would end the other sites' steps if the step failed."""

    site: str
    round: int
    failed: str
    """The reason, as the round table shows it."""

    def as_json(self) -> dict[str, Any]:
        return {"site": self.site, "round": self.round, "failed": self.failed}


@dataclass(frozen=True)
class LeftOut:
    """The decision that a site is left out of a round (`left_out.json`): it failed every attempt, was
    late, or was skipped (--skip-site)."""

    site: str
    round: int
    reason: str
    attempts: int
    """Attempts its training made (0: skipped, or not started by the deadline)."""
    unix: float
    """When it was decided."""

    def as_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "round": self.round,
            "reason": self.reason,
            "attempts": self.attempts,
            "unix": self.unix,
        }


@dataclass(frozen=True)
class Attempt:
    """One attempt of a site's training as cost.json keeps it; times in unix seconds."""

    job: str | None
    """The SLURM job; None for a local site, or a submission that failed."""
    nodes: int | None
    """Nodes the job held (a local site: 1); None when nothing ran."""
    submit: float | None
    start: float | None
    end: float | None
    """None while it runs (RUNNING)."""
    outcome: str
    """finished, failed: ..., late: ..., refused: ..., or RUNNING."""
    processes: int | None = None
    """A local site's training processes (launch.nproc), what its node-hours count."""

    def as_json(self) -> dict[str, Any]:
        """The receipt's entry, with the keys it has always had: `processes` only for a local site."""
        entry: dict[str, Any] = {"job": self.job, "nodes": self.nodes}
        if self.processes is not None:
            entry["processes"] = self.processes
        return {**entry, "submit": self.submit, "start": self.start, "end": self.end, "outcome": self.outcome}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        """From an entry whose fields match ATTEMPT_FIELDS."""
        return cls(
            job=data.get("job"),
            nodes=data.get("nodes"),
            submit=data.get("submit"),
            start=data.get("start"),
            end=data.get("end"),
            outcome=data["outcome"],
            processes=data.get("processes"),
        )


@dataclass(frozen=True)
class BufferedTask:
    """mode: buffered: one contribution a site sets out to make (`buffered/<site>/task-NNN/task.json`),
    written before its training starts: the global version it trains from, kept so that a resumed
    federation continues the same training from the same version."""

    site: str
    task: int
    """The site's contributions count from 1."""
    base_version: int
    """The global version the site's training starts from (0: the base model)."""

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # a new record: its JSON keys are its fields, in their order

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BufferedTask:
        return cls(**{k: data[k] for k in TASK_FIELDS})


@dataclass(frozen=True)
class Arrival:
    """mode: buffered: a site's change as the coordinator took it (`arrivals/arrival-NNNNNN.json`, in the
    order they came): its staleness and weight, and whether it was dropped. The published versions are
    computed from these records alone."""

    number: int
    """The arrival's place in the federation's order, from 1."""
    site: str
    task: int
    base_version: int
    """The global version the site's training started from."""
    version: int
    """The newest published version when it arrived: the one its change is applied to."""
    staleness: int
    """u = version - base_version."""
    tokens: int
    samples: int | None
    weight: float
    """Its weight before normalising: tokens (or samples, 1, the site's weight: aggregation.weights) x s(u); 0 when dropped."""
    dropped: bool
    """Staler than aggregation.max_staleness: recorded, never averaged."""
    checkpoint: str
    """The site's checkpoint its change was taken from."""
    sent: str | None
    """The transfer package holding its change from its base version (what the average reads); None when dropped."""
    unix: float

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Arrival:
        return cls(**{k: data[k] for k in ARRIVAL_FIELDS})


@dataclass(frozen=True)
class PublishedVersion:
    """mode: buffered: a global version and the arrivals it was averaged from (`round-NNN/published.json`,
    written after the version's model is in place)."""

    version: int
    global_model: str
    previous: str
    """The version its arrivals' changes were applied to (and whose server optimizer state it continues)."""
    arrivals: list[int]
    """The numbers of the arrivals averaged, in order."""
    weights: list[float]
    """Their normalised weights, in the same order."""
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # the lists copied: a record never shares them

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PublishedVersion:
        return cls(**{k: data[k] for k in PUBLISHED_FIELDS})
