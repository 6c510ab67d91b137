"""The attempt rules every executor shares (federation/rounds/attempts.py) and an attempt's cost record
(federation/state/records.py's Attempt, kept by cost.py): the reason's wording, and cost.json's entries as they have
always been written, read back by the cost columns."""

from __future__ import annotations

import json
from pathlib import Path

from supertune.federation.config.schema import FederationConfig
from supertune.federation.rounds.attempts import REASON_CHARS, not_started, reason_of
from supertune.federation.state.cost import Attempt, record_attempt, site_cost


def test_a_reason_is_the_first_line_without_the_label_cut_to_size() -> None:
    error = RuntimeError("site-a round 2: local training stopped (exit code 1)\nTraceback ...")
    assert reason_of(error, "site-a round 2") == "local training stopped (exit code 1)"
    assert reason_of(error) == "site-a round 2: local training stopped (exit code 1)"
    assert len(reason_of("x" * 1000, "site-a round 2")) == REASON_CHARS == 300
    assert not_started(FederationConfig(round_deadline="2h")) == "late: not started after 2h"
    assert not_started(FederationConfig(round_deadline="90")) == "late: not started after 90s"


def test_attempts_are_written_as_before_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    record_attempt(
        path, Attempt(job=None, nodes=None, submit=None, start=None, end=None, outcome="failed: submitting its job")
    )
    record_attempt(
        path, Attempt(job=None, nodes=1, submit=100.0, start=100.0, end=3700.0, outcome="finished", processes=2)
    )
    record_attempt(
        path, Attempt(job="42", nodes=4, submit=0.0, start=1800.0, end=5400.0, outcome="late: running after 1h")
    )
    record_attempt(
        path, Attempt(job="42", nodes=4, submit=0.0, start=1800.0, end=9999.0, outcome="finished")
    )  # the same job
    attempts = json.loads(path.read_text(encoding="utf-8"))["attempts"]
    keys = {"job", "nodes", "submit", "start", "end", "outcome"}
    assert [set(a) for a in attempts] == [keys, keys | {"processes"}, keys]  # processes: a local site's only
    # node-hours: 2 processes x 1 h here, 4 nodes x 1 h on the cluster; queue: the job's 30 min
    assert site_cost(path) == {"node_hours": 6.0, "queue_s": 1800.0, "attempts": 3}
