"""Receipts: the record that a phase of a round is done, written atomically when it is, and read
back to know where a federation stands (no other state is kept).

Every receipt supertune computes with is checked against its fields when it is written as when it is
read (a wrong field is one line naming the file and the field, never a traceback in a later round),
and the typed ones (records.py: a training's receipt, a step's failure report, a site's attempts) are
written and read here only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import UserError
from ...rundir import write_json_atomic
from ...state_records import Field, record_damage
from .records import (
    ARRIVAL_FIELDS,
    ATTEMPT_FIELDS,
    FAILED_TRAINING_FIELDS,
    LEFT_OUT_FIELDS,
    PUBLISHED_FIELDS,
    TASK_FIELDS,
    TRAINED_FIELDS,
    Arrival,
    Attempt,
    BufferedTask,
    FailedTraining,
    LeftOut,
    PublishedVersion,
    TrainedReceipt,
)

__all__ = [
    "write_receipt",
    "read_receipt",
    "write_trained",
    "read_trained",
    "write_left_out",
    "write_attempts",
    "read_attempts",
    "attempts_from",
    "write_task",
    "read_task",
    "write_arrival",
    "read_arrival",
    "write_published",
    "read_published",
    "checked_checkpoint",
    "checked_global_model",
]

AVERAGED_FIELDS = {
    "round": Field("int"),
    "global_model": Field("str"),
    "weights": Field("dict"),
    "tokens": Field("dict"),
    "left_out": Field("dict", required=False),
    "seconds": Field("number", required=False),
    "privacy": Field("dict", required=False),
}
EVALUATED_FIELDS = {
    "eval_loss": Field("number"),
    "eval_tokens": Field("int", required=False),
    "model": Field("str", required=False),
    "seconds": Field("number", required=False),
}
COST_FIELDS = {"attempts": Field("list")}
"""What the phases' receipts hold that later phases compute with (phases.py, site_eval.py, quorum.py and
cost.py write them)."""


def _fields(path: Path, data: dict[str, Any]) -> dict[str, Field] | None:
    name = path.name
    if name == "trained.json" or (name.startswith("trained-") and name.endswith(".json")):
        # a StreamFlow step's report of a failed training takes the place of the receipt
        return FAILED_TRAINING_FIELDS if name != "trained.json" and "failed" in data else TRAINED_FIELDS
    if name == "averaged.json":
        return AVERAGED_FIELDS
    if name == "evaluated.json" or (name.startswith("evaluated-") and name.endswith(".json")):
        return EVALUATED_FIELDS
    if name == "left_out.json":
        return LEFT_OUT_FIELDS
    if name == "cost.json":
        return COST_FIELDS
    if name == "task.json":
        return TASK_FIELDS
    if name.startswith("arrival-") and name.endswith(".json"):
        return ARRIVAL_FIELDS
    if name == "published.json":
        return PUBLISHED_FIELDS
    return None


def _damage(path: Path, data: Any) -> str | None:
    """How the record for `path` differs from what supertune writes there, or None."""
    if not isinstance(data, dict):
        return "not an object"
    fields = _fields(path, data)
    damage = record_damage(data, fields) if fields else None
    if damage is None and fields is AVERAGED_FIELDS:
        bad = [k for k, v in data["weights"].items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        damage = f"the weight of {bad[0]} is {data['weights'][bad[0]]!r}, not a number" if bad else None
    if damage is None and fields is COST_FIELDS:
        damage = _attempts_damage(data["attempts"])
    return damage


def _attempts_damage(attempts: list[Any]) -> str | None:
    for number, entry in enumerate(attempts, start=1):
        damage = record_damage(entry, ATTEMPT_FIELDS)
        if damage:
            return f"attempt {number}: {damage}"
    return None


def write_receipt(path: Path, record: dict[str, Any]) -> None:
    """Write `record` at `path` atomically, after checking it as read_receipt will (UserError naming
    the file and the field otherwise: nothing is written)."""
    damage = _damage(path, record)
    if damage:
        raise UserError(f"{path}: not written, the receipt would be damaged ({damage})")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)


def read_receipt(path: Path) -> dict[str, Any] | None:
    """The receipt at `path`, or None when the phase has not finished."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable receipt ({exc}); delete it to redo that phase") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a receipt; delete it to redo that phase")
    damage = _damage(path, data)
    if damage:
        raise UserError(f"{path}: a damaged receipt ({damage}); delete it to redo that phase")
    return data


def write_trained(path: Path, receipt: TrainedReceipt | FailedTraining) -> None:
    """A site's training receipt (or a StreamFlow step's report of its failure, at its step's output)."""
    write_receipt(path, receipt.as_json())


def read_trained(path: Path) -> TrainedReceipt | None:
    """The training receipt at `path`; None when the training has not finished (no receipt, or a step's
    report that it failed)."""
    data = read_receipt(path)
    if data is None or "failed" in data and _fields(path, data) is FAILED_TRAINING_FIELDS:
        return None
    return TrainedReceipt.from_json(data)


def write_left_out(path: Path, decision: LeftOut) -> None:
    """A site's left_out.json: the round goes on without it."""
    write_receipt(path, decision.as_json())


def write_attempts(path: Path, attempts: list[Attempt]) -> None:
    """A site's cost.json: every attempt of its training in the round, in order."""
    write_receipt(path, {"attempts": [a.as_json() for a in attempts]})


def read_attempts(path: Path) -> list[Attempt] | None:
    """The attempts in a site's cost.json; None when it has none."""
    data = read_receipt(path)
    return None if data is None else [Attempt.from_json(a) for a in data["attempts"]]


def write_task(path: Path, task: BufferedTask) -> None:
    """mode: buffered: a site's task.json, before its training starts."""
    write_receipt(path, task.as_json())


def read_task(path: Path) -> BufferedTask | None:
    data = read_receipt(path)
    return None if data is None else BufferedTask.from_json(data)


def write_arrival(path: Path, arrival: Arrival) -> None:
    """mode: buffered: the receipt of one change taken (arrivals/arrival-NNNNNN.json)."""
    write_receipt(path, arrival.as_json())


def read_arrival(path: Path) -> Arrival | None:
    data = read_receipt(path)
    return None if data is None else Arrival.from_json(data)


def write_published(path: Path, version: PublishedVersion) -> None:
    """mode: buffered: the receipt of a published global version, written after its model is in place."""
    write_receipt(path, version.as_json())


def read_published(path: Path) -> PublishedVersion | None:
    data = read_receipt(path)
    return None if data is None else PublishedVersion.from_json(data)


def attempts_from(entries: Any, where: str) -> list[Attempt]:
    """The attempts a site's agent sent (`where`: the exchange's record they came in), checked as
    cost.json's are; a damaged one is a UserError naming the record and the field."""
    if entries is None:
        return []
    damage = "attempts is not a list" if not isinstance(entries, list) else _attempts_damage(entries)
    if damage:
        raise UserError(f"{where}: a damaged record ({damage})")
    return [Attempt.from_json(a) for a in entries]


def _unlike_its_manifest(directory: Path, read: Any) -> list[str]:
    """How `directory` differs from the files its manifest (read by `read`) lists, by size: a
    missing or unreadable manifest is a problem too."""
    from ...file_table import table_problems

    try:
        return table_problems(directory, read(directory).files, hashes=False)
    except (OSError, ValueError) as exc:
        return [str(exc)]


def checked_checkpoint(receipt: Path, record: dict[str, Any], site: str, number: int) -> str:
    """The checkpoint a site's training receipt names, when it is that site's own of that round: it lies
    in the site's folder beside the receipt (a site on this machine) and its files are still the ones
    its manifest lists (sizes: a deleted or replaced checkpoint is named here, before any average)."""
    from ...checkpoints.manifest import read_manifest

    checkpoint = Path(record["checkpoint"])
    own = receipt.parent.resolve()
    label = f"{site} round {number}"
    if record["site"] != site or record["round"] != number or own not in checkpoint.resolve().parents:
        raise UserError(
            f"{label}: {receipt} names {checkpoint} (site {record['site']}, round {record['round']}), not a checkpoint "
            f"of this site's run in {own}; delete the receipt to redo the site's training"
        )
    # Sizes here; the average reads every byte once and checks each file's sha256 as it goes.
    problems = _unlike_its_manifest(checkpoint, read_manifest)
    if problems:
        raise UserError(
            f"{label}: {checkpoint}, named by {receipt}, no longer matches its manifest ({'; '.join(problems[:2])}); "
            "delete the receipt to redo the site's training"
        )
    return str(checkpoint)


def checked_global_model(receipt: Path, number: int) -> None:
    """The global model round `number`'s average receipt records is still there, with the files its
    manifest lists (sizes): what the next round starts from, or a finished federation's result. A
    deleted or damaged one is a UserError naming it and the way out, not a later round's puzzle."""
    from ...averaging import read_average_manifest

    record = read_receipt(receipt)
    if record is None:
        return
    model = Path(record["global_model"])
    problems = _unlike_its_manifest(model, read_average_manifest)
    if problems:
        raise UserError(
            f"round {number}: its global model {model}, recorded by {receipt}, is gone or no longer matches its "
            f"manifest ({'; '.join(problems[:2])}); delete {receipt} to average round {number} again from its sites' checkpoints"
        )
