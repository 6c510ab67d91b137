"""The built-in executor's SLURM attempts (executors/builtin/slurm_training.py) under the attempt policy,
with the scheduler's answers scripted (tests/test_federation_slurm.py runs the same rules against a real
Slurm cluster): a submission that failed is an attempt, tried again `poll_seconds` later; a job that
ended without a finished run is submitted again; a job unfinished at the deadline is cancelled; each
attempt goes to the site's cost.json."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supertune.errors import UserError
from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig
from supertune.federation.executors.builtin import slurm_training
from supertune.federation.executors.builtin.executor import BuiltinExecutor
from supertune.federation.rounds.attempt_policy import AttemptPolicy
from supertune.federation.rounds.failures import FederationError
from supertune.federation.rounds.loop import RoundWork, SiteWork
from supertune.federation.state.layout import FederationDir
from supertune.slurm.commands import JobState


def _round(tmp_path: Path, retries: int, until: float | None) -> tuple[AttemptPolicy, slurm_training.SlurmTraining]:
    site = SiteConfig(name="there", where="cluster")
    fed = FederationConfig(name="f", sites=[site], site_retries=retries, poll_seconds=0.01,
                           round_deadline="1h" if until else None, aggregation=AggregationConfig(min_sites=0))  # fmt: skip
    sd = FederationDir(tmp_path).round(1).site("there")
    w = SiteWork(site, 1, sd.config, sd.path, run=sd.run, receipt=sd.trained)
    work = RoundWork(
        1, tmp_path / "g0", tmp_path / "g1", tmp_path / "averaged.json", train=[w], trained={"there": sd.trained}
    )
    return AttemptPolicy(fed, work, until), slurm_training.SlurmTraining(fed, until)


def _scripted(monkeypatch, submissions: list, endings: list[JobState], finished: list[bool]) -> list[str]:
    """Submissions (a job id, or a FederationError raised), the states the jobs end in, whether each
    ended job's run finished; returns the jobs cancelled."""
    cancelled: list[str] = []

    def submit(self, w):
        got = submissions.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    def wait_for_jobs(jobs, poll, changed, until=None) -> Iterator[tuple[str, JobState]]:
        for name in list(jobs):
            yield name, endings.pop(0)

    monkeypatch.setattr(slurm_training.SlurmTraining, "_submit", submit)
    monkeypatch.setattr("supertune.runs.wait.wait_for_jobs", wait_for_jobs)
    monkeypatch.setattr("supertune.slurm.commands.cancel_job", cancelled.append)
    monkeypatch.setattr(slurm_training, "record_finished_training", lambda w: finished.pop(0))
    return cancelled


def _ended(job: str, state: str, code: str = "0:0") -> JobState:
    return JobState(job, state, exit_code=code, submit_time="2026-11-26T10:00:00", start_time="2026-11-26T10:10:00",
                    end_time="2026-11-26T11:10:00", num_nodes=2)  # fmt: skip


def test_a_failed_submission_and_a_failed_job_are_attempts_tried_again(tmp_path: Path, monkeypatch, caplog) -> None:
    policy, runner = _round(tmp_path, retries=2, until=None)
    refused = FederationError("there round 1: submitting the training failed: ssh: timed out",
                              reason="failed: submitting its job: ssh: timed out")  # fmt: skip
    _scripted(monkeypatch, [refused, "41", "42"], [_ended("41", "FAILED", "1:0"), _ended("42", "COMPLETED")],
              [False, True])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="supertune"):
        policy.wait(policy.start(policy.work.train, runner), runner)
    assert policy.failed == {} and policy.tries == {"there": 3}
    assert "there round 1: attempt 1 of 3 failed; trying again in 0.01s: there round 1: submitting" in caplog.text
    assert (
        "there round 1: attempt 2 of 3 failed; trying again: there round 1: training job 41 ended FAILED" in caplog.text
    )
    attempts = json.loads((tmp_path / "round-001" / "there" / "cost.json").read_text())["attempts"]
    assert [(a["job"], a["nodes"], a["outcome"]) for a in attempts] == [
        (None, None, "failed: submitting its job: ssh: timed out"),
        ("41", 2, "failed: exit 1"),
        ("42", 2, "finished"),
    ]


def test_a_job_unfinished_at_the_deadline_is_cancelled_and_left_to_the_quorum(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    policy, runner = _round(tmp_path, retries=2, until=time.time() + 3600)
    queued = JobState("43", "PENDING", reason="Priority", submit_time="2026-11-26T10:00:00", num_nodes=2)
    cancelled = _scripted(monkeypatch, ["43"], [queued], [])
    with caplog.at_level(logging.WARNING, logger="supertune"):
        policy.wait(policy.start(policy.work.train, runner), runner)
    assert cancelled == ["43"] and policy.failed == {"there": ("late: still queued after 1h", 1)}
    assert "there round 1: late: still queued after 1h; job 43 cancelled" in caplog.text
    [attempt] = json.loads((tmp_path / "round-001" / "there" / "cost.json").read_text())["attempts"]
    assert (attempt["job"], attempt["start"], attempt["outcome"]) == ("43", None, "late: still queued after 1h")


def test_without_a_quorum_or_a_deadline_a_job_that_failed_every_attempt_stops_the_federation(
    tmp_path: Path, monkeypatch
) -> None:
    policy, runner = _round(tmp_path, retries=0, until=None)
    policy.fed.aggregation.min_sites = None
    _scripted(monkeypatch, ["44"], [_ended("44", "FAILED", "0:9")], [False])
    with pytest.raises(FederationError) as stopped:
        policy.wait(policy.start(policy.work.train, runner), runner)
    assert stopped.value.reason == "failed: killed by signal 9 (job FAILED)"
    assert str(stopped.value).startswith("there round 1: training job 44 ended FAILED without finishing")


def _evaluation(tmp_path: Path, monkeypatch, retries: int, submissions: list) -> tuple[list, Callable[[], None]]:
    """A SLURM site's evaluation by the built-in executor, its submissions scripted (a job id, or the
    UserError sbatch's failure is); its job writes the receipt. Returns the submissions' record and the executor."""
    site = SiteConfig(name="there", where="cluster")
    fed = FederationConfig(name="f", sites=[site], site_retries=retries, poll_seconds=0.01)
    sd = FederationDir(tmp_path).round(1).site("there")
    w = SiteWork(site, 1, sd.config, sd.path, receipt=sd.evaluated)
    tried: list = []

    def submit_evaluation(work: SiteWork, model: Path) -> str:
        tried.append(submissions[0])
        got = submissions.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    def wait_for_jobs(jobs, poll, changed, until=None) -> Iterator[tuple[str, JobState]]:
        for name in list(jobs):
            sd.path.mkdir(parents=True, exist_ok=True)
            sd.evaluated.write_text('{"eval_loss": 2.0}')
            yield name, _ended(jobs[name], "COMPLETED")

    monkeypatch.setattr("supertune.federation.rounds.site_jobs.submit_evaluation", submit_evaluation)
    monkeypatch.setattr("supertune.runs.wait.wait_for_jobs", wait_for_jobs)
    executor = BuiltinExecutor(fed)
    return tried, lambda: executor._evaluate([w], tmp_path / "g1")


def test_a_failed_submission_of_an_evaluation_job_is_tried_again_within_site_retries(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """Before, the first sbatch that failed (a login node gone for a moment) stopped the federation."""
    refused = UserError("sbatch failed (exit 1): Socket timed out on send/recv operation")
    tried, evaluate = _evaluation(tmp_path, monkeypatch, 1, [refused, "51"])
    with caplog.at_level(logging.INFO, logger="supertune"):
        evaluate()
    assert len(tried) == 2 and (tmp_path / "round-001" / "there" / "evaluated.json").is_file()
    assert (
        "there round 1: submitting the evaluation job failed (attempt 1 of 2); trying again in 0.01s: sbatch failed"
        in caplog.text
    )
    assert "there round 1: submitted evaluation job 51 to cluster" in caplog.text
    # every attempt refused: the federation stops with the site, the job and the last error named
    tried, evaluate = _evaluation(tmp_path / "again", monkeypatch, 1, [refused, refused])
    with pytest.raises(FederationError) as stopped:
        evaluate()
    assert len(tried) == 2 and stopped.value.reason == "failed: submitting its evaluation job"
    assert str(stopped.value).startswith(
        "there round 1: submitting the evaluation job failed 2 time(s) (1 + site_retries): sbatch failed (exit 1)"
    )
