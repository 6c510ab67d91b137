"""A site's agent (executor: agents) over its whole life, in one process and in seconds: an agent run
by hand waits out an outage of the exchange; a dropped site's agent is told at the exchange and stops;
a late site's node-hours reach the coordinator. The federation's own runs are in
tests/test_federation_agents.py and tests/test_federation_agents_quorum.py."""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path

import yaml

from supertune.cli.main import main
from supertune.exchange import Exchange, parse_exchange
from supertune.federation.executors.agents import exchange_layout as names
from supertune.federation.executors.agents import site_agent


def _federation(exchange: str, **extra) -> str:
    return yaml.safe_dump({"name": "life", "rounds": 2, "executor": "agents", "exchange": exchange,
                           "sites": [{"name": "a"}, {"name": "b"}], **extra})  # fmt: skip


def test_an_agent_run_by_hand_waits_out_an_outage_of_the_exchange(
    tmp_path: Path, ssh_server, monkeypatch, caplog, capsys
) -> None:
    """The exchange's host unreachable (ssh's exit code 255, as when a VPN drops) through the exchange's
    retries and longer: the agent waits and asks again, and when the exchange answers it reads the
    federation's config there (here one without its site, which ends it with that error). Before, the
    first outage ended the agent with exit 2."""
    down, failed = tmp_path / "down", tmp_path / "failed"
    flaky = tmp_path / "flaky-ssh"
    flaky.write_text(
        f'#!/bin/sh\nif [ -e "{down}" ]; then echo x >> "{failed}"; echo "ssh: connect: No route to host" >&2; '
        f'exit 255; fi\nexec {ssh_server.ssh} "$@"\n'
    )
    flaky.chmod(0o755)
    down.touch()
    monkeypatch.setenv("SUPERTUNE_SSH", str(flaky))
    # the exchange's backoff (2, 4, 8, 16 s) and the agent's wait after it (300 s), shortened
    monkeypatch.setattr(site_agent, "Exchange", functools.partial(Exchange, backoff=0.01))
    monkeypatch.setattr(site_agent, "OUTAGE_WAIT", 0.2, raising=False)
    url = f"{ssh_server.url}{tmp_path / 'exchange'}"
    ended: list[int] = []
    agent = threading.Thread(
        target=lambda: ended.append(main(["federate", "--site", "c", url, "--dir", str(tmp_path / "agent")])),
        daemon=True,
    )
    with caplog.at_level(logging.WARNING, logger="supertune"):
        agent.start()
        deadline = time.time() + 60
        # two outages in a row of the exchange's five tries each: the agent waited out the first
        while (not failed.exists() or len(failed.read_text().split()) < 10) and agent.is_alive():
            assert time.time() < deadline, "the agent did not ask the exchange again"
            time.sleep(0.05)
        assert agent.is_alive() and not ended, "the agent stopped at the outage"
        down.unlink()
        config = tmp_path / "federation.yaml"
        config.write_text(_federation(url))
        with Exchange(parse_exchange(url)) as exchange:
            exchange.put_file(config, names.CONFIG)
        agent.join(timeout=60)
    assert ended == [2]
    assert "the exchange is unreachable; the agent tries again in 0.2 s, from where it was" in caplog.text
    assert capsys.readouterr().err.strip().endswith("--site: 'c' is not a site of federation life; its sites are a, b")


def _coordinator(tmp_path: Path, exchange: str, **extra):
    """A coordinator of the federation `_federation` in tmp_path/fed, as `supertune federate` makes it."""
    from supertune.federation.config.load import federation_text, load_federation
    from supertune.federation.executors.agents.coordinator import AgentsExecutor
    from supertune.federation.state.layout import FederationDir

    config = tmp_path / "federation.yaml"
    config.write_text(_federation(exchange, **extra))
    fed, _ = load_federation(config)
    root = FederationDir(tmp_path / "fed")
    root.path.mkdir()
    root.config.write_text(federation_text(fed))
    return fed, root, AgentsExecutor


def test_a_dropped_sites_agent_is_told_at_the_exchange_and_stops(tmp_path: Path, capsys) -> None:
    """site-b's agent waits for round 0's global model; the federation is run again with --drop b: the
    coordinator puts the drop on the exchange, and the agent stops there (exit 0, one line). Before, it
    was never told, and waited, trained and sent for a federation that no longer averaged it."""
    from supertune.federation.rounds.loop import RoundWork
    from supertune.federation.state.history import active_federation, drop_sites

    exchange = str(tmp_path / "exchange")
    fed, root, coordinator = _coordinator(tmp_path, exchange, poll_seconds=1)
    coordinator(fed, root).run_round(RoundWork(0, tmp_path / "base", tmp_path / "base", root.round(0).averaged))
    ended: list[int] = []
    agent = threading.Thread(
        target=lambda: ended.append(main(["federate", "--site", "b", exchange, "--dir", str(tmp_path / "agent-b")])),
        daemon=True,
    )
    agent.start()
    time.sleep(1.5)  # the agent has read the config and waits for the global model (a drop is found either way)
    assert agent.is_alive()
    drop_sites(fed, root, ["b"])
    # the coordinator run again (`supertune federate DIR --drop b`) with the sites still active
    coordinator(active_federation(fed, root), root).run_round(
        RoundWork(0, tmp_path / "base", tmp_path / "base", root.round(0).averaged)
    )
    agent.join(timeout=30)
    assert not agent.is_alive() and ended == [0]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"supertune: site b: dropped from federation life from round 1 on by its coordinator (--drop); the agent "
        f"stops (its runs and receipts stay in {tmp_path / 'agent-b'})"
    ]
    # an agent of the dropped site started later stops at once
    assert main(["federate", "--site", "b", exchange, "--dir", str(tmp_path / "agent-b")]) == 0
    assert "dropped from federation life" in capsys.readouterr().out


def test_a_late_sites_node_hours_reach_the_coordinator(tmp_path: Path) -> None:
    """site-b had no result at the exchange by round 1's deadline and was left out late; its agent ended
    its training at the same deadline and reported the attempt (2 processes for an hour) after the
    decision. While the coordinator waits for the round's evaluations it keeps that as site-b's cost.json:
    the table's cost columns count it. Before, they stayed empty for a late site."""
    from supertune.federation.reports.table import table_rows
    from supertune.federation.rounds.loop import RoundWork, SiteWork
    from supertune.federation.state.receipts import write_left_out, write_receipt
    from supertune.federation.state.records import LeftOut

    exchange_dir = str(tmp_path / "exchange")
    fed, root, coordinator = _coordinator(tmp_path, exchange_dir, poll_seconds=1, round_deadline="1h",
                                          aggregation={"min_sites": 1})  # fmt: skip
    rd = root.round(1)
    write_receipt(rd.started, {"round": 1, "unix": 1000.0, "deadline_s": 3600})
    late = "late: no result at the exchange after 1h"
    write_left_out(rd.site("b").left_out, LeftOut(site="b", round=1, reason=late, attempts=1, unix=4600.0))
    model = tmp_path / "global-1"
    model.mkdir()
    (model / "config.json").write_text("{}")
    ended = {"job": None, "nodes": 1, "processes": 2, "submit": None, "start": 1000.0, "end": 4600.0,
             "outcome": "late: running after 1h"}  # fmt: skip
    with Exchange(parse_exchange(exchange_dir)) as exchange:
        exchange.put_json(names.site_eval("a", 1), {"eval_loss": 2.0})
        exchange.put_json(names.site_failed("b", 1), {"round": 1, "start": 1000.0, "reason": ended["outcome"],
                                                      "tries": 1, "attempts": [ended]})  # fmt: skip
    a = SiteWork(fed.sites[0], 1, tmp_path / "a.yaml", rd.site("a").path, receipt=rd.site("a").evaluated)
    coordinator(fed, root).run_round(RoundWork(1, tmp_path / "base", model, rd.averaged, evaluate=[a]))
    [row] = [r for r in table_rows(fed, root) if r["site"] == "b"]
    assert (row["node_hours"], row["attempts"], row["left_out"]) == (2.0, 1, late)
