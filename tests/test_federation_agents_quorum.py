"""A federation of site agents that goes on without a site (aggregation.min_sites, site_retries,
round_deadline with executor: agents; docs/federated/agents.md "Site agents" and docs/federated/failures.md "Retries, a quorum, a
deadline"): real processes, a coordinator and two agents meeting at a directory exchange.

Round 1: site-b's agent is killed (its process group, as when its node is lost) once it has evaluated
the base model, so the coordinator finds no result at the round's deadline and averages site-a alone;
the coordinator itself is killed (SIGKILL) in the middle of that average and run again: it keeps the
decision (site-a's model is round 1's global model). Round 2: site-b's agent, started again, trains,
and its training is killed at step 1 at both attempts (site_retries: 1): it reports the failure and the
round goes on without it. Round 3: site-b is back.

Also, in one process against a directory exchange whose site records are written as agents write
them: a round below its quorum stops, forgets its start and, run again, starts anew (a report of the
earlier start is not taken for this one), which is what a failed site's agent waits for to try again;
a site skipped with --skip-site is named in the round's start record, and its agent does not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from load_scale import deadline_seconds
from supertune.federation.config.default import site_corpus
from supertune.federation.config.durations import duration_text


def _model(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.slow
def test_an_agents_federation_goes_on_without_a_late_site_and_a_failed_one(tmp_path: Path) -> None:
    # Seconds a round's training may take: site-a's evaluation, 2 steps and its upload, and site-b's
    # two attempts killed at step 1, fit well within 60 s on an idle machine, within 6 process starts
    # on a loaded one; site-b's lateness in round 1 costs the test one deadline.
    deadline = deadline_seconds(60, starts=6)
    exchange = tmp_path / "exchange"
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0",
                     "training.report_to=[]", "data.max_eval_samples=8", "training.warmup_steps=0"]  # fmt: skip
        sites.append({"name": name, "overrides": overrides, "steps_per_round": 2})
    config = {"name": "agents-quorum", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 3,
              "executor": "agents", "exchange": str(exchange), "poll_seconds": 1, "site_retries": 1,
              "round_deadline": f"{deadline}s", "aggregation": {"min_sites": 1}, "sites": sites,
              "benchmarks": ["supertune_corpus_nouns"]}  # fmt: skip
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    fed = tmp_path / "fed"
    procs: list[subprocess.Popen] = []

    def start(*args: str, log: str, **env: str) -> subprocess.Popen:
        out = (tmp_path / log).open("w")
        proc = subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=dict(os.environ, **env), cwd=tmp_path,
                                start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    def wait_for(path: Path, *alive: tuple[subprocess.Popen, str]) -> None:
        until = time.time() + 600
        while not path.is_file():
            for proc, log in alive:
                assert proc.poll() is None, (tmp_path / log).read_text()[-3000:]
            assert time.time() < until, f"no {path}"
            time.sleep(0.2)

    def agent(site: str, log: str, **env: str) -> subprocess.Popen:
        return start("--site", site, str(exchange), "--dir", str(tmp_path / site), log=log, **env)

    # the coordinator dies in its first average (round 1's), after deciding about site-b
    coordinator = start(str(tmp_path / "federation.yaml"), "--dir", str(fed), log="c1.log",
                        SUPERTUNE_FAULT="average.tensor@2")  # fmt: skip
    agent_a = agent("site-a", "a.log")
    agent_b = agent("site-b", "b1.log")
    try:
        wait_for(exchange / "sites" / "site-b" / "eval-000.json", (agent_b, "b1.log"))
        os.killpg(agent_b.pid, signal.SIGKILL)
        agent_b.wait()
        assert coordinator.wait(timeout=600) == -signal.SIGKILL, (tmp_path / "c1.log").read_text()[-3000:]
        left = json.loads((fed / "round-001" / "site-b" / "left_out.json").read_text())
        assert left["reason"] == f"late: no result at the exchange after {duration_text(deadline)}"
        assert not (fed / "round-001" / "global").exists()
        coordinator = start(str(fed), log="c2.log")
        wait_for(exchange / "global" / "round-001.json", (coordinator, "c2.log"))
        # site-b's agent again, whose training of round 2 is killed at step 1, every attempt
        agent_b = agent("site-b", "b2.log", SUPERTUNE_FAULT="step@1", SUPERTUNE_FAULT_IN="round-002/site-b/")
        for proc, log in ((agent_a, "a.log"), (agent_b, "b2.log"), (coordinator, "c2.log")):
            assert proc.wait(timeout=900) == 0, (tmp_path / log).read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert "resuming the federation" in (tmp_path / "c2.log").read_text()
    # Round 1, decided before the kill: site-a's model alone is the global model.
    trained = json.loads((tmp_path / "site-a" / "round-001" / "site-a" / "trained.json").read_text())
    ours, theirs = _model(fed / "round-001" / "global"), _model(Path(trained["checkpoint"]))
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    averaged = [json.loads((fed / f"round-{n:03d}" / "averaged.json").read_text()) for n in (1, 2, 3)]
    assert [sorted(a["weights"]) for a in averaged] == [["site-a"], ["site-a"], ["site-a", "site-b"]]
    # Round 2: site-b's agent reported both failed attempts, and their cost
    left = json.loads((fed / "round-002" / "site-b" / "left_out.json").read_text())
    assert (left["reason"], left["attempts"]) == ("failed: killed by signal 9", 2)
    cost = json.loads((fed / "round-002" / "site-b" / "cost.json").read_text())["attempts"]
    assert [a["outcome"] for a in cost] == ["failed: killed by signal 9"] * 2
    # the decisions reached site-b's agent: not evaluated on rounds 1 and 2, round 3 trained from round 2's model
    said = (tmp_path / "b2.log").read_text()
    assert "site-b: round 1 was averaged without it; nothing is sent" in said
    assert "site-b: left out of round 2 by the coordinator (failed: killed by signal 9)" in said
    assert sorted(p.name for p in (exchange / "sites" / "site-b").glob("eval-*.json")) == [
        "eval-000.json",
        "eval-003.json",
    ]
    site = yaml.safe_load((tmp_path / "site-b" / "round-003" / "site-b" / "site.yaml").read_text())
    assert site["model"]["name_or_path"] == str(tmp_path / "site-b" / "round-002" / "global")
    # each agent's training had the coordinator's start of the round (its deadline counts from it)
    for number in (2, 3):
        coordinator_start = json.loads((fed / f"round-{number:03d}" / "started.json").read_text())["unix"]
        assert json.loads((tmp_path / "site-a" / f"round-{number:03d}" / "started.json").read_text())["unix"] == (
            coordinator_start
        )
    rows = {(r["round"], r["site"]): r for r in json.loads((fed / "rounds.json").read_text())["rows"]}
    assert rows[1, "site-b"]["left_out"] == f"late: no result at the exchange after {duration_text(deadline)}"
    assert rows[2, "site-b"]["left_out"] == "failed: killed by signal 9" and rows[2, "site-b"]["node_hours"] > 0
    assert rows[3, "site-b"]["left_out"] is None and rows[3, "site-b"]["tokens"] > 0
    assert "left out: failed: killed by signal 9 |" in (fed / "rounds.md").read_text()
    # the benchmarks ran on the coordinator's copy of every round's global model
    scores = json.loads((fed / "rounds.json").read_text())["benchmarks"]
    assert sorted(scores) == ["1", "2", "3"] and all(
        0 <= s["supertune_corpus_nouns"]["acc"] <= 1 for s in scores.values()
    )


def test_a_round_below_its_quorum_starts_again_and_the_failed_agents_with_it(tmp_path: Path) -> None:
    from supertune.errors import UserError
    from supertune.exchange import Exchange, parse_exchange
    from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig
    from supertune.federation.executors.agents import exchange_layout as names
    from supertune.federation.executors.agents.coordinator import AgentsExecutor
    from supertune.federation.executors.agents.site_agent import _Agent
    from supertune.federation.rounds.loop import RoundWork, SiteWork
    from supertune.federation.rounds.quorum import skip_sites
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.receipts import read_receipt, write_receipt

    sites = [SiteConfig(name=n) for n in ("a", "b", "c")]
    fed = FederationConfig(name="q", rounds=1, executor="agents", exchange=str(tmp_path / "exchange"), poll_seconds=1,
                           round_deadline="2s", aggregation=AggregationConfig(min_sites=2), sites=sites)  # fmt: skip
    root = FederationDir(tmp_path / "fed")
    root.config.parent.mkdir(parents=True)
    root.config.write_text("name: q\n")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    exchange = Exchange(parse_exchange(fed.exchange))
    coordinator = AgentsExecutor(fed, root)
    rd = root.round(1)

    def work() -> RoundWork:
        train = [SiteWork(s, 1, tmp_path / "x.yaml", rd.site(s.name).path, receipt=rd.site(s.name).trained)
                 for s in sites if read_receipt(rd.site(s.name).left_out) is None]  # fmt: skip
        return RoundWork(1, base, rd.global_model, rd.averaged, train=train, trained={w.name: w.receipt for w in train})

    start = coordinator._put_start(1)
    for name in ("a", "b"):  # as an agent reports a training that failed every attempt of this start
        report = {"round": 1, "start": start["unix"], "reason": "failed: exit 1", "tries": 2, "attempts": []}
        exchange.put_json(names.site_failed(name, 1), report)
    with pytest.raises(UserError) as stopped:
        coordinator.run_round(work())
    assert str(stopped.value).startswith(
        "round 1: 0 of 3 sites finished training by its deadline (round_deadline 2s) and the round needs "
        "aggregation.min_sites=2; a: failed: exit 1 (2 attempts); b: failed: exit 1 (2 attempts); "
        "c: late: no result at the exchange after 2s (1 attempt); run "
    )
    assert not rd.started.exists() and not list(rd.path.rglob("left_out.json"))
    # site-b's agent failed that start of the round and waits for the round's global model
    agent = _Agent(fed, sites[1], FederationDir(tmp_path / "agent-b"), exchange)
    write_receipt(agent.root.round(1).started, {"round": 1, "unix": start["unix"]})
    write_receipt(agent.root.round(1).site("b").left_out, {"reason": "failed: exit 1", "attempts": 2})
    assert not agent._started_again(1)
    # run again: a new start, with which the earlier reports do not count
    with pytest.raises(UserError) as again:
        coordinator.run_round(work())
    assert "a: late: no result at the exchange after 2s" in str(again.value)
    assert agent._started_again(1)  # the cue for site-b's agent to train the round again
    skip_sites(fed, root, ["b"])
    assert coordinator._put_start(1)["left_out"] == {"b": "skipped: --skip-site"}
    assert exchange.get_json(names.round_start(1))["left_out"] == {"b": "skipped: --skip-site"}
    assert not agent._started_again(1)  # skipped: its agent does not train the round
