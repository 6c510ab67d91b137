"""The typed records a federation keeps per site and round: a finished training (`trained.json`, and the
`trained-<site>.json` a StreamFlow step hands out), a failed training as a step reports it, and the
attempts of a site's training (`cost.json`). Each is a dataclass with the JSON it has always been
(`as_json`, key for key and in the same order, so that directories made before these types resume as
they are) and the fields receipts.py checks when it writes one as when it reads one back.

Built from what was read (`from_json`) only after receipts.py found its fields sound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...state_records import Field

__all__ = [
    "TrainedReceipt",
    "FailedTraining",
    "LeftOut",
    "Attempt",
    "TRAINED_FIELDS",
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
