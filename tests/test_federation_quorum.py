"""Rounds that go on without a failed site (aggregation.min_sites, site_retries) and sites that take part
in some rounds only (sites[].from_round, until_round): the config's checks, the decision and its
receipt, and a real federation whose site fails every attempt and is left out of the round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supertune.errors import UserError
from supertune.federation.config.default import site_corpus
from supertune.federation.config.load import federation_problems
from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig


def _fed(**extra) -> FederationConfig:
    sites = extra.pop("sites", [SiteConfig(name="a"), SiteConfig(name="b")])
    return FederationConfig(rounds=3, sites=sites, **extra)


def test_participation_and_quorum_settings_are_checked_all_at_once() -> None:
    problems = federation_problems(
        _fed(
            site_retries=-1,
            aggregation=AggregationConfig(min_sites=0),
            sites=[SiteConfig(name="a", from_round=4), SiteConfig(name="b", from_round=2, until_round=1)],
        )
    )
    assert "site_retries: must be 0 or more, got -1" in problems
    assert "aggregation.min_sites: must be at least 1 (or empty: every site of the round), got 0" in problems
    assert "sites[0] (a).from_round: must be a round from 1 to rounds=3, got 4" in problems
    assert "sites[1] (b).until_round: 1 is before from_round=2; give a later round, or none (the last)" in problems
    # a round without a site, a quorum no round can meet
    gap = _fed(sites=[SiteConfig(name="a", until_round=1), SiteConfig(name="b", from_round=3)])
    assert federation_problems(gap) == [
        "sites[].from_round/until_round: no site trains in round 2; every round needs a site"
    ]
    short = _fed(
        aggregation=AggregationConfig(min_sites=2), sites=[SiteConfig(name="a"), SiteConfig(name="b", until_round=2)]
    )
    assert federation_problems(short) == [
        "aggregation.min_sites: 2, but round 3 has 1 site (sites[].from_round/until_round); lower it, or let more sites take part in that round"
    ]
    assert (
        federation_problems(_fed(executor="streamflow", site_retries=1, aggregation=AggregationConfig(min_sites=1)))
        == []
    )
    joined = _fed(sites=[SiteConfig(name="a"), SiteConfig(name="b", from_round=2, until_round=2)])
    assert federation_problems(joined) == []
    assert [[s.name for s in joined.sites if s.in_round(n)] for n in range(4)] == [["a", "b"], ["a"], ["a", "b"], ["a"]]


def _round(tmp_path: Path, finished: list[str], failing: list[str]):
    from supertune.federation.rounds.loop import RoundWork, SiteWork
    from supertune.federation.state.receipts import write_receipt

    root = tmp_path / "fed"
    work = RoundWork(
        2, root / "round-001" / "global", root / "round-002" / "global", root / "round-002" / "averaged.json"
    )
    for name in finished + failing:
        site_dir = root / "round-002" / name
        work.trained[name] = site_dir / "trained.json"
        work.evaluate.append(
            SiteWork(SiteConfig(name=name), 2, Path("x.yaml"), site_dir, receipt=site_dir / "evaluated.json")
        )
        if name in finished:
            record = {"site": name, "round": 2, "run": str(site_dir / "run"), "checkpoint": str(site_dir / "run")}
            write_receipt(
                site_dir / "trained.json", {**record, "step": 1, "tokens": 1, "samples": 1, "eval_loss": None}
            )
    return work


def test_a_round_below_its_quorum_stops_saying_how_to_go_on_and_decides_nothing(tmp_path: Path) -> None:
    from supertune.federation.rounds.quorum import leave_out_failed_sites

    work = _round(tmp_path, ["a"], ["b", "c"])
    failed = {"b": ("local training stopped (exit code 2)", 2), "c": ("local training stopped (exit code 137)", 2)}
    with pytest.raises(UserError) as stopped:
        leave_out_failed_sites(_fed(aggregation=AggregationConfig(min_sites=2)), work, failed)
    assert str(stopped.value) == (
        "round 2: 1 of 3 sites finished training and the round needs aggregation.min_sites=2; "
        "b: local training stopped (exit code 2) (2 attempts); c: local training stopped (exit code 137) (2 attempts); "
        f"run `supertune federate {tmp_path / 'fed'}` again to go on (each unfinished site resumes from its latest "
        f"checkpoint), or leave a site out of this round with `supertune federate {tmp_path / 'fed'} --skip-site NAME` "
        "(for good: --drop NAME)"
    )
    assert not list((tmp_path / "fed").rglob("left_out.json")) and set(work.trained) == {"a", "b", "c"}


def test_a_round_that_meets_its_quorum_leaves_the_failed_site_out_with_a_receipt(tmp_path: Path) -> None:
    from supertune.federation.rounds.quorum import leave_out_failed_sites

    work = _round(tmp_path, ["a", "c"], ["b"])
    leave_out_failed_sites(
        _fed(aggregation=AggregationConfig(min_sites=2)), work, {"b": ("local training stopped (exit code 2)", 3)}
    )
    receipt = json.loads((tmp_path / "fed" / "round-002" / "b" / "left_out.json").read_text())
    assert {k: receipt[k] for k in ("site", "round", "reason", "attempts")} == {
        "site": "b", "round": 2, "reason": "local training stopped (exit code 2)", "attempts": 3}  # fmt: skip
    assert list(work.trained) == ["a", "c"] and [w.name for w in work.evaluate] == ["a", "c"]
    assert work.left_out == {"b": "local training stopped (exit code 2)"}


@pytest.mark.slow
def test_a_site_that_fails_every_attempt_is_left_out_and_the_round_goes_on(tmp_path: Path) -> None:
    sites = []
    for name, extra in (("site-a", []), ("site-b", ["training.learning_rate=1e30"])):  # NaN at step 2, every time
        train, validation = site_corpus(name)
        sites.append({"name": name, "steps_per_round": 2,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}",
                                    "generate.max_new_tokens=0", "training.report_to=[]", "training.warmup_steps=0",
                                    "data.max_eval_samples=8", *extra]})  # fmt: skip
    config = {"name": "fed-quorum", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1,
              "site_retries": 1, "aggregation": {"min_sites": 1}, "sites": sites}  # fmt: skip
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    fed_dir = tmp_path / "fed"

    def federate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "supertune", "federate", *args], capture_output=True, text=True)

    proc = federate(str(path), "--dir", str(fed_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "site-b round 1: attempt 1 of 2 failed; trying again" in proc.stderr
    left = json.loads((fed_dir / "round-001" / "site-b" / "left_out.json").read_text())
    assert left["attempts"] == 2 and left["reason"] == "failed: exit 2"
    averaged = json.loads((fed_dir / "round-001" / "averaged.json").read_text())
    assert averaged["weights"] == {"site-a": 1.0} and averaged["left_out"] == {"site-b": left["reason"]}
    assert not (fed_dir / "round-001" / "site-b" / "evaluated.json").exists()
    status = federate("--status", str(fed_dir)).stdout
    assert "- site-b: left out of round 1 (2 attempt(s)), the round averaged without it (" in status
    # the decision is kept: run again, nothing is retried or redone
    again = federate(str(fed_dir))
    assert again.returncode == 0 and "training here" not in again.stderr, again.stderr[-3000:]


def test_fixed_weights_follow_the_sites_averaged_when_some_are_not_in_the_round(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from average_models import make_checkpoint, save_model
    from supertune.federation.rounds.phases import average_round

    fed = FederationConfig(
        rounds=2,
        sites=[
            SiteConfig(name="a", weight=1.0),
            SiteConfig(name="b", weight=2.0, until_round=1),
            SiteConfig(name="c", weight=3.0),
        ],  # fmt: skip
    )
    models = [str(make_checkpoint(save_model(tmp_path / n, i), tokens=10, samples=1)) for i, n in enumerate("ac")]
    record = average_round(
        fed, 2, ["a", "c"], models, tmp_path / "previous", tmp_path / "global", tmp_path / "averaged.json",
        left_out={"x": "reason"},
    )  # fmt: skip
    assert record["weights"] == {"a": 0.25, "c": 0.75} and record["left_out"] == {"x": "reason"}


def test_a_round_holds_only_its_sites_and_not_those_left_out_of_it(tmp_path: Path) -> None:
    """The work of round 2 (every receipt there but the average: nothing to train or evaluate) names the
    sites in it: not one whose until_round has passed, not one left out of it after failing."""
    from supertune.federation.config.sites import SitePlan
    from supertune.federation.rounds.loop import round_work
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.receipts import write_receipt

    sites = [SiteConfig(name="a"), SiteConfig(name="b", until_round=1), SiteConfig(name="c"), SiteConfig(name="d")]
    fed = FederationConfig(rounds=2, sites=sites)
    root = FederationDir(tmp_path)
    rd = root.round(2)
    for name in "acd":
        trained = {"site": name, "round": 2, "run": "r", "checkpoint": "x", "step": 1, "tokens": 1, "samples": 1}
        write_receipt(rd.site(name).trained, {**trained, "eval_loss": 1.0})
        write_receipt(rd.site(name).evaluated, {"eval_loss": 1.0})
    write_receipt(rd.site("d").left_out, {"reason": "local training stopped (exit code 2)", "attempts": 1})
    plans = [SitePlan(s, None, "") for s in sites]  # type: ignore[arg-type]  # the configs are not read: all trained
    work = round_work(fed, plans, root, 2, tmp_path / "previous", tmp_path / "base")
    assert list(work.trained) == ["a", "c"] and work.average and not work.train and not work.evaluate
    assert work.left_out == {"d": "local training stopped (exit code 2)"}


def test_skip_site_leaves_a_site_out_of_the_next_round_only_and_refuses_what_it_cannot(tmp_path: Path) -> None:
    from supertune.federation.rounds.quorum import skip_sites
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.receipts import write_receipt

    root = FederationDir(tmp_path)
    sites = [SiteConfig(name="a"), SiteConfig(name="b"), SiteConfig(name="c", from_round=2)]
    fed = FederationConfig(rounds=2, sites=sites, aggregation=AggregationConfig(min_sites=1))
    write_receipt(root.round(1).averaged, {"round": 1, "global_model": "g", "weights": {}, "tokens": {}})
    refusals = {
        "d": "--skip-site: 'd' is not a site of this federation; its sites are a, b, c",
        "b a c": "--skip-site: round 2 would keep 0 sites (none) and needs 1 (aggregation.min_sites); skip fewer sites",
    }
    for names, message in refusals.items():
        with pytest.raises(UserError) as refused:
            skip_sites(fed, root, names.split())
        assert str(refused.value) == message
    late = FederationConfig(rounds=2, sites=[SiteConfig(name="a"), SiteConfig(name="b", until_round=1)])
    with pytest.raises(
        UserError, match=r"^--skip-site: site b does not train in round 2 \(from_round/until_round\); nothing to skip$"
    ):
        skip_sites(late, root, ["b"])
    assert not list(tmp_path.rglob("left_out.json"))  # nothing written by a refusal
    skip_sites(fed, root, ["b", "b"])  # round 2, the first not averaged
    receipt = json.loads((tmp_path / "round-002" / "b" / "left_out.json").read_text())
    assert {k: receipt[k] for k in ("site", "round", "reason", "attempts")} == {
        "site": "b", "round": 2, "reason": "skipped: --skip-site", "attempts": 0}  # fmt: skip
    assert not (tmp_path / "round-001" / "b" / "left_out.json").exists()
