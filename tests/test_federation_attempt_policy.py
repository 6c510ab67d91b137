"""The attempt policy (federation/rounds/attempt_policy.py) with a runner that only says how each attempt
ends: retries while site_retries and the deadline allow, a late attempt cancelled and never tried again,
a failure raised at once without a quorum or a deadline, and a batch runner's every failure left to the
quorum; what it says in the log, each executor's tests pin with real processes and jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig
from supertune.federation.rounds.attempt_policy import FINISHED, AttemptPolicy, Ending
from supertune.federation.rounds.failures import FederationError
from supertune.federation.rounds.loop import RoundWork, SiteWork


class Scripted:
    """A runner whose attempts end as scripted per site, in order; started ones end in `ended`."""

    def __init__(self, script: dict[str, list[Ending]], batch: bool = False, waits: bool = False) -> None:
        self.script, self.batch, self.waits = script, batch, waits
        self.starts: list[tuple[str, int]] = []
        self.cancelled: list[str] = []

    def start(self, w: SiteWork, tries: int) -> str | Ending:
        self.starts.append((w.name, tries))
        return w.name if self.waits else self.script[w.name].pop(0)

    def ended(self, started: dict[str, str]) -> Iterator[tuple[str, Ending]]:
        for name in list(started):
            yield name, self.script[name].pop(0)

    def cancel(self, w: SiteWork, handle: str, ending: Ending) -> Ending:
        self.cancelled.append(w.name)
        return Ending(ending.reason, late=True, note=f"job of {w.name} cancelled")


def _policy(
    tmp_path: Path, retries: int = 1, min_sites: int | None = None, until: float | None = None
) -> AttemptPolicy:
    sites = [SiteConfig(name=n) for n in ("a", "b")]
    fed = FederationConfig(
        name="f", sites=sites, site_retries=retries, aggregation=AggregationConfig(min_sites=min_sites)
    )
    works = [SiteWork(s, 1, tmp_path / "c.yaml", tmp_path / s.name) for s in sites]
    work = RoundWork(1, tmp_path / "g0", tmp_path / "g1", tmp_path / "averaged.json", train=works)
    return AttemptPolicy(fed, work, until)


def test_a_failed_attempt_is_tried_again_while_retries_last(tmp_path: Path, caplog) -> None:
    policy = _policy(tmp_path, retries=1, min_sites=1)
    runner = Scripted({"a": [Ending("failed: exit 1", "a round 1: stopped"), FINISHED],
                       "b": [Ending("failed: exit 2", "b round 1: stopped")] * 2}, waits=True)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="supertune"):
        policy.run(policy.work.train, runner)
    assert runner.starts == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert policy.failed == {"b": ("failed: exit 2", 2)}
    assert "a round 1: attempt 1 of 2 failed; trying again: a round 1: stopped" in caplog.text
    assert "b round 1: attempt 2 of 2 failed: b round 1: stopped" in caplog.text


def test_without_a_quorum_or_a_deadline_the_last_failure_stops_the_federation(tmp_path: Path) -> None:
    policy = _policy(tmp_path, retries=0)
    runner = Scripted({"a": [Ending("failed: exit 1", "a round 1: local training stopped")]})
    with pytest.raises(FederationError) as stopped:
        policy.run(policy.work.train[:1], runner)
    assert (str(stopped.value), stopped.value.reason) == ("a round 1: local training stopped", "failed: exit 1")


def test_a_late_attempt_is_cancelled_and_not_tried_again(tmp_path: Path, caplog) -> None:
    policy = _policy(tmp_path, retries=3, until=time.time() + 3600)
    runner = Scripted({"a": [FINISHED], "b": [Ending("late: running after 1h", late=True)]}, waits=True)
    with caplog.at_level(logging.WARNING, logger="supertune"):
        policy.run(policy.work.train, runner)
    assert runner.cancelled == ["b"] and runner.starts == [("a", 1), ("b", 1)]
    assert policy.failed == {"b": ("late: running after 1h", 1)}
    assert "b round 1: late: running after 1h; job of b cancelled" in caplog.text


def test_past_the_deadline_a_site_keeps_its_last_reason_and_one_never_started_is_not_counted(tmp_path: Path) -> None:
    policy = _policy(tmp_path, retries=1, until=time.time() - 1)
    not_started = Ending("late: not started after 1h", late=True, tried=False)
    runner = Scripted({"a": [not_started], "b": [not_started]})
    policy.run(policy.work.train, runner)
    assert policy.failed == {"a": ("late: not started after 1h", 0), "b": ("late: not started after 1h", 0)}
    policy = _policy(tmp_path, retries=1, until=time.time() + 3600)
    runner = Scripted({"a": [Ending("failed: exit 1", pause=0.0), not_started]})
    policy.run(policy.work.train[:1], runner)
    assert policy.failed == {"a": ("failed: exit 1", 1)}


def test_a_batch_runner_says_every_attempt_and_leaves_every_failure_to_the_quorum(tmp_path: Path, caplog) -> None:
    policy = _policy(tmp_path, retries=1)  # no quorum, no deadline: still no raise
    runner = Scripted({"a": [FINISHED], "b": [Ending("failed: exit 2")] * 2}, batch=True, waits=True)
    with caplog.at_level(logging.WARNING, logger="supertune"):
        policy.run(policy.work.train, runner)
    assert policy.failed == {"b": ("failed: exit 2", 2)}
    assert "b round 1: attempt 1 of 2: failed: exit 2; trying again" in caplog.text
    assert "b round 1: attempt 2 of 2: failed: exit 2\n" in caplog.text + "\n"


def test_a_refusal_that_another_attempt_cannot_change_is_not_tried_again(tmp_path: Path) -> None:
    policy = _policy(tmp_path, retries=2, min_sites=1)
    runner = Scripted({"a": [Ending("refused: damaged", "a round 1: damaged", again=False)]})
    policy.run(policy.work.train[:1], runner)
    assert runner.starts == [("a", 1)] and policy.failed == {"a": ("refused: damaged", 1)}
