"""A federation's typed records (federation/state/records.py), read and written through receipts.py
only: a federation directory made before they were typed, its files written below as their writers
wrote them, reads as it did (the round table, the cost columns) and is written back byte for byte; a
bad field is refused in one line naming the file and the field, when written as when read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supertune.errors import UserError
from supertune.federation.config.schema import FederationConfig, SiteConfig
from supertune.federation.reports.table import table_rows
from supertune.federation.state.cost import end_running_attempts, record_attempt, site_cost
from supertune.federation.state.layout import FederationDir
from supertune.federation.state.receipts import (
    read_attempts,
    read_receipt,
    read_trained,
    write_attempts,
    write_left_out,
    write_receipt,
    write_trained,
)
from supertune.federation.state.records import Attempt, FailedTraining, LeftOut, TrainedReceipt

# Round 1 of a federation of three sites as the federation wrote it before its records were typed:
# `a` trained here (two attempts: a failed one, then a finished one), `b` on a cluster after a failed
# submission, `c` was left out late; `b`'s receipt is of the oldest shape (no loss_tokens, no seconds).
BEFORE = {
    "round-001/averaged.json": {
        "global_model": "/fed/round-001/global", "left_out": {"c": "late: running after 1h"}, "received_bytes": 800,
        "round": 1, "seconds": 2.5, "sent_bytes": {"a": 400, "b": 400}, "tokens": {"a": 1000, "b": 3000},
        "weights": {"a": 0.25, "b": 0.75},
    },
    "round-001/started.json": {"deadline_s": 3600.0, "round": 1, "unix": 1700000000.0},
    "round-001/a/trained.json": {
        "checkpoint": "/fed/round-001/a/run/checkpoints/step-000008", "eval_loss": 4.5, "loss_tokens": 900,
        "round": 1, "run": "/fed/round-001/a/run", "samples": 32, "seconds": 12.0, "site": "a", "step": 8,
        "tokens": 1000,
    },
    "round-001/a/cost.json": {"attempts": [
        {"end": 1700000100.0, "job": None, "nodes": 1, "outcome": "failed: exit 1", "processes": 2,
         "start": 1700000000.0, "submit": 1700000000.0},
        {"end": 1700003700.0, "job": None, "nodes": 1, "outcome": "finished", "processes": 2,
         "start": 1700000100.0, "submit": 1700000100.0},
    ]},
    "round-001/a/evaluated.json": {"eval_loss": 4.25, "eval_tokens": 640, "model": "/fed/round-001/global", "seconds": 1.5},
    "round-000/a/evaluated.json": {"eval_loss": 5.0, "seconds": 1.0},
    "round-001/b/trained.json": {
        "checkpoint": "/fed/round-001/b/run/checkpoints/step-000008", "eval_loss": None, "round": 1,
        "run": "/fed/round-001/b/run", "samples": None, "site": "b", "step": 8, "tokens": 3000,
    },
    "round-001/b/cost.json": {"attempts": [
        {"end": None, "job": None, "nodes": None, "outcome": "failed: submitting its job: ssh: timed out",
         "start": None, "submit": None},
        {"end": 1700007200, "job": "42", "nodes": 4, "outcome": "finished", "start": 1700003600, "submit": 1700001800},
    ]},
    "round-001/c/left_out.json": {
        "attempts": 1, "reason": "late: running after 1h", "round": 1, "site": "c", "unix": 1700003600.0,
    },
    "round-001/c/cost.json": {"attempts": [
        {"end": 1700003600.0, "job": None, "nodes": 1, "outcome": "running", "processes": 1,
         "start": 1700000000.0, "submit": 1700000000.0},
    ]},
    "streamflow/round-001/out/trained-c.json": {"failed": "failed: exit 2", "round": 1, "site": "c"},
}  # fmt: skip


def _before(tmp_path: Path) -> FederationDir:
    """The directory, each file as write_json_atomic wrote it (sorted keys, two spaces, a newline)."""
    for name, record in BEFORE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return FederationDir(tmp_path)


def test_a_federation_made_before_the_typed_records_reads_as_it_did(tmp_path: Path) -> None:
    root = _before(tmp_path)
    rd = root.round(1)
    a = read_trained(rd.site("a").trained)
    assert a == TrainedReceipt("a", 1, "/fed/round-001/a/run", "/fed/round-001/a/run/checkpoints/step-000008", 8,
                               1000, 900, 32, 4.5, 12.0)  # fmt: skip
    b = read_trained(rd.site("b").trained)
    assert b is not None and (b.loss_tokens, b.seconds, b.eval_loss) == (None, 0.0, None)
    assert read_trained(tmp_path / "streamflow/round-001/out/trained-c.json") is None  # a step's failure report
    assert read_attempts(rd.site("b").cost)[0] == Attempt(
        None, None, None, None, None, BEFORE["round-001/b/cost.json"]["attempts"][0]["outcome"]
    )
    assert read_attempts(rd.site("a").trained.parent / "nothing.json") is None
    assert site_cost(rd.site("a").cost) == {"node_hours": 2.0 * 3700 / 3600, "queue_s": 0.0, "attempts": 2}
    assert site_cost(rd.site("b").cost) == {"node_hours": 4.0, "queue_s": 1800.0, "attempts": 2}
    sites = [SiteConfig(name=n) for n in "abc"]
    rows = {r["site"]: r for r in table_rows(FederationConfig(name="before", rounds=1, sites=sites), root)}
    assert (rows["a"]["tokens"], rows["a"]["loss_tokens"], rows["a"]["train_s"], rows["a"]["global"]) == (
        1000,
        900,
        12.0,
        4.25,
    )
    assert (rows["b"]["tokens"], rows["b"]["loss_tokens"], rows["b"]["train_s"], rows["b"]["weight"]) == (
        3000,
        None,
        0.0,
        0.75,
    )
    assert (rows["c"]["tokens"], rows["c"]["left_out"], rows["c"]["attempts"]) == (None, "late: running after 1h", 1)


def test_the_records_are_written_back_byte_for_byte(tmp_path: Path) -> None:
    root = _before(tmp_path)
    written = {name: (tmp_path / name).read_bytes() for name in BEFORE}
    site_a = root.round(1).site("a")
    write_trained(site_a.trained, read_trained(site_a.trained))
    for site in "abc":
        write_attempts(root.round(1).site(site).cost, read_attempts(root.round(1).site(site).cost))
    for name in ("round-001/averaged.json", "round-001/a/evaluated.json"):
        write_receipt(tmp_path / name, read_receipt(tmp_path / name))
    write_left_out(root.round(1).site("c").left_out, LeftOut(**read_receipt(root.round(1).site("c").left_out)))
    report = tmp_path / "streamflow/round-001/out/trained-c.json"
    write_trained(report, FailedTraining("c", 1, "failed: exit 2"))
    assert {name: (tmp_path / name).read_bytes() for name in BEFORE} == written
    # A resumed federation adds to a site's attempts and closes its running one, the earlier ones as they were.
    record_attempt(site_a.cost, Attempt(job=None, nodes=1, submit=1.0, start=1.0, end=2.0, outcome="finished"))
    assert json.loads(site_a.cost.read_text())["attempts"][:2] == BEFORE["round-001/a/cost.json"]["attempts"]
    [closed] = end_running_attempts(root.round(1).site("c").cost, 1700009999.0, "failed: ended")
    assert closed.outcome == "running"
    assert read_attempts(root.round(1).site("c").cost)[0].outcome == "failed: ended"


BAD = [
    ("round-001/a/trained.json", {**BEFORE["round-001/a/trained.json"], "step": "8"}, "step is '8', not a whole number"),
    ("round-001/c/left_out.json", {**BEFORE["round-001/c/left_out.json"], "attempts": None},
     "attempts is None, not a whole number"),
    ("round-001/b/cost.json", {"attempts": [{"job": 42, "outcome": "finished"}]},
     "attempt 1: job is 42, not text"),
    ("round-001/b/cost.json", {"attempts": [{"job": "42"}]}, "attempt 1: no outcome"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "record", "damage"), BAD, ids=[b[2] for b in BAD])
def test_a_bad_field_is_one_line_naming_the_file_when_written_as_when_read(
    tmp_path: Path, name: str, record: dict, damage: str
) -> None:
    path = tmp_path / name
    with pytest.raises(UserError) as refused:
        write_receipt(path, record)
    assert str(refused.value) == f"{path}: not written, the receipt would be damaged ({damage})"
    assert not path.exists()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record), encoding="utf-8")  # a hand edit, or a file cut short
    with pytest.raises(UserError) as caught:
        read_receipt(path)
    assert str(caught.value) == f"{path}: a damaged receipt ({damage}); delete it to redo that phase"
