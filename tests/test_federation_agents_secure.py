"""Secure aggregation carried by site agents (executor: agents, privacy.secure_aggregation;
docs/federated/privacy.md, "Secure aggregation"): real processes, a coordinator and two agents with
their own keys meeting at a directory exchange, and the check of a peer's posted key in one process.

The global model is the sites' weighted average change on the shared scales, within half a shared
step of the exact one; every file the coordinator and the exchange hold is a record, a masked upload,
a sum or a global model: no site's change in the clear, and a site's masked values are uniform bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from federation_cli import SITE_OVERRIDES, corpus_sites
from load_scale import deadline_seconds
from supertune.errors import UserError
from supertune.federation.config.default import site_corpus
from supertune.federation.state.site_key import make_site_key
from supertune.transfer.secure_sum import SecureSum, pack_bits


def _model(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _config(tmp_path: Path, keys: dict[str, str]) -> dict:
    sites = corpus_sites(2)
    for site in sites:
        site["public_key"] = keys[site["name"]]
    return {"name": "masked", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "sites": sites,
            "executor": "agents", "exchange": str(tmp_path / "exchange"), "poll_seconds": 1,
            "transfer": {"delta": True, "dtype": "int8", "block_size": 64},
            "privacy": {"secure_aggregation": True}}  # fmt: skip


def _run_federation(tmp_path: Path, keys: dict[str, str], fault: dict[str, str] | None = None) -> dict[str, int]:
    """Run the coordinator and an agent per site of `keys` (with `fault`: SUPERTUNE_FAULT for that site's
    agent) to their end; each process's exit code, by its log's name."""
    exchange = str(tmp_path / "exchange")

    def start(*args: str, log: str, **env: str) -> subprocess.Popen:
        out = (tmp_path / log).open("w")
        return subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, env=dict(os.environ, **env),
                                start_new_session=True)  # fmt: skip

    procs = {
        "coordinator": start(str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed"), log="coordinator.log")
    }
    for n in keys:
        env = {"SUPERTUNE_FAULT": fault[n]} if fault and n in fault else {}
        procs[n] = start("--site", n, exchange, "--dir", str(tmp_path / n), "--key", str(tmp_path / f"{n}.key"),
                         log=f"{n}.log", **env)  # fmt: skip
    try:
        codes = {}
        for name, proc in procs.items():
            codes[name] = proc.wait(timeout=900)
            if codes[name] != 0 and not (fault and name in fault):
                raise AssertionError((tmp_path / f"{name}.log").read_text()[-3000:])
        return codes
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def _chi_square_of_bytes(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, np.uint8), minlength=256).astype(np.float64)
    expected = len(data) / 256
    return float(((counts - expected) ** 2 / expected).sum())


def _average_within_half_a_step(tmp_path: Path, weights: dict[str, float], lr: float = 1.0) -> tuple[dict, dict, dict]:
    """Check round 1's global model against the weighted average of the changes the agents' checkpoints
    hold (the sites of `weights`), applied at the server learning rate `lr` (fedavgm without momentum):
    within half a shared step (times lr) of it, and within one step of the plain int8 federation's
    average. Returns (base model, global model, each site's change)."""
    fed = tmp_path / "fed"
    assert abs(sum(weights.values()) - 1) < 1e-12
    g, now = _model(fed / "round-000" / "global"), _model(fed / "round-001" / "global")
    changes = {}
    for site in weights:
        trained = json.loads((tmp_path / site / "round-001" / site / "trained.json").read_text())
        x = _model(Path(trained["checkpoint"]))
        changes[site] = {n: x[n].astype(np.float64) - g[n] for n in g}
    # The expectation: the weighted average of the changes clipped to the shared range, and the plain
    # int8 federation's (each site's change on its own blocks' scales), from the sites' checkpoints.
    ss = SecureSum("int8", len(weights), 64)
    worst_exact = worst_plain = 0.0
    for n in g:
        numel = g[n].size
        field = sum(ss.scale_field(changes[s][n].reshape(-1).astype(np.float32)).astype(np.uint64) for s in weights)
        step = np.repeat(ss.shared_scales(field).astype(np.float64), 64)[:numel]  # each value's shared step
        exact = g[n].reshape(-1).astype(np.float64)
        plain = exact.copy()
        for s in weights:
            d = changes[s][n].reshape(-1)
            exact += lr * weights[s] * np.clip(d, -127 * step, 127 * step)
            padded = np.zeros(-(-numel // 64) * 64)
            padded[:numel] = d
            own = np.abs(padded.reshape(-1, 64)).max(axis=1) / 127  # the site's own int8 scale of each block
            own_scale = np.repeat(np.where(own > 0, own, 1.0), 64)[:numel]
            plain += lr * weights[s] * np.rint(d / own_scale) * own_scale
        got = now[n].reshape(-1).astype(np.float64)
        rounding = np.abs(exact) * 2.0**-23  # the global model is float32
        step = lr * np.maximum(step, 1e-30)
        worst_exact = max(worst_exact, float(((np.abs(got - exact) - rounding) / step).max()))
        worst_plain = max(worst_plain, float(((np.abs(got - plain) - rounding) / step).max()))
    assert worst_exact <= 0.5 + 1e-6, worst_exact  # within half a shared step of the exact weighted average
    assert worst_plain <= 1.0 + 1e-6, worst_plain  # and of the plain int8 average, whose own step is finer
    assert max(float(np.abs(now[n] - g[n]).max()) for n in g) > 0  # the round moved the model
    return g, now, changes


def _two_sites(tmp_path: Path) -> dict[str, str]:
    """Two sites' keys and the federation config of two rounds (fedavgm at server_lr 0.5) in `tmp_path`."""
    keys = {name: make_site_key(tmp_path / f"{name}.key") for name in ("site-a", "site-b")}
    config = _config(tmp_path, keys)
    config["aggregation"] = {"server_lr": 0.5}  # the server step applies the decoded average as the delta path's
    config["rounds"] = 2  # round 2 masks again, from round 1's global model, under round 2's keys
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return keys


@pytest.fixture(scope="module")
def masked(tmp_path_factory) -> Path:
    """An uninterrupted federation of two agents (_two_sites): its directory."""
    tmp_path = tmp_path_factory.mktemp("masked")
    codes = _run_federation(tmp_path, _two_sites(tmp_path))
    assert set(codes.values()) == {0}, codes
    return tmp_path


@pytest.mark.slow
def test_two_agents_mask_their_changes_and_the_coordinator_publishes_their_average(masked: Path) -> None:
    """Two rounds; round 1's global model is checked against the sites' checkpoints, and what the
    coordinator and the exchange hold is walked."""
    tmp_path = masked
    keys = ("site-a", "site-b")
    fed = tmp_path / "fed"
    averaged = json.loads((fed / "round-001" / "averaged.json").read_text())
    weights = averaged["weights"]
    assert sorted(weights) == ["site-a", "site-b"] and averaged["secure_aggregation"]["attempt"] == 1
    g, now, changes = _average_within_half_a_step(tmp_path, weights, lr=0.5)

    # Every file of the coordinator and the exchange: no transfer package, no residual, no change in the
    # clear; what a site sent is its two masked uploads and their records.
    for root in (fed, tmp_path / "exchange"):
        for path in root.rglob("*"):
            assert path.name not in ("transfer.safetensors", "residual.safetensors", "supertune-transfer.json"), path
            if (root.name == "exchange" and path.relative_to(root).parts[0] == "sites") or path.parent.name == "sent":
                assert path.is_dir() or path.suffix in (".json", ".upload"), path
    uploads = sorted(p.name for p in (fed / "round-001" / "site-a" / "sent").iterdir())
    assert uploads == ["scales.upload", "values.upload"]
    masked = (fed / "round-001" / "site-a" / "sent" / "values.upload").read_bytes().partition(b"\n")[2]
    ss = SecureSum("int8", 2, 64)
    unmasked = b"".join(
        pack_bits(ss.encode(changes["site-a"][n].reshape(-1).astype(np.float32),
                            ss.shared_scales(sum(ss.scale_field(changes[s][n].reshape(-1).astype(np.float32))
                                                 .astype(np.uint64) for s in keys)), weights["site-a"])[0],
                  ss.sum_bits).tobytes()
        for n in g
    )  # fmt: skip
    assert len(masked) == len(unmasked)
    # chi-square of the bytes against uniform, 255 degrees of freedom: mean 255, sd 22.6; 400 is 6.4 sd
    assert _chi_square_of_bytes(masked) < 400, _chi_square_of_bytes(masked)
    assert _chi_square_of_bytes(unmasked) > 10_000  # the same integers unmasked are far from uniform
    table = json.loads((fed / "rounds.json").read_text())
    second = json.loads((fed / "round-002" / "averaged.json").read_text())
    assert second["secure_aggregation"]["attempt"] == 1 and second["sent_bytes"] == averaged["sent_bytes"]
    assert [r["sent_bytes"] for r in table["rows"]] == [averaged["sent_bytes"][s] for s in ("site-a", "site-b")] * 2
    moved = _model(fed / "round-002" / "global")
    assert max(float(np.abs(moved[n] - now[n]).max()) for n in now) > 0


@pytest.mark.slow
def test_a_secure_round_killed_at_its_phases_resumes_to_the_same_global_models(masked: Path, tmp_path: Path) -> None:
    """The same federation, its coordinator killed (SIGKILL) once it has put round 1's scales' sum on the
    exchange and site-a's agent once it has put its masked scales, each started again: every global
    model is the uninterrupted federation's, tensor for tensor (the decoded sum is the integers' sum,
    whichever masks the sites' other keys made)."""
    keys = _two_sites(tmp_path)
    exchange = str(tmp_path / "exchange")

    def start(name: str, *args: str, **env: str) -> subprocess.Popen:
        out = (tmp_path / f"{name}.log").open("a")
        return subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, env=dict(os.environ, **env),
                                start_new_session=True)  # fmt: skip

    def agent(name: str, **env: str) -> subprocess.Popen:
        return start(
            name, "--site", name, exchange, "--dir", str(tmp_path / name), "--key", str(tmp_path / f"{name}.key"), **env
        )

    coordinator_args = (str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed"))
    procs = [start("coordinator", *coordinator_args, SUPERTUNE_FAULT="secure.summed@1"),
             agent("site-a", SUPERTUNE_FAULT="secure.scales@1"), agent("site-b")]  # fmt: skip
    try:
        assert procs[0].wait(timeout=900) == -9, (tmp_path / "coordinator.log").read_text()[-3000:]
        assert procs[1].wait(timeout=900) == -9, (tmp_path / "site-a.log").read_text()[-3000:]
        procs += [start("coordinator", *coordinator_args), agent("site-a")]
        for proc, log in zip(procs[2:], ("site-b", "coordinator", "site-a")):
            assert proc.wait(timeout=900) == 0, (tmp_path / f"{log}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert sorted(keys) == ["site-a", "site-b"]
    for number in (1, 2):
        ours = _model(tmp_path / "fed" / f"round-{number:03d}" / "global")
        theirs = _model(masked / "fed" / f"round-{number:03d}" / "global")
        assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours), number


@pytest.mark.slow
def test_a_site_lost_after_the_others_masked_against_it_does_not_lose_the_round(tmp_path: Path) -> None:
    """Three sites, a quorum of two and a deadline: site-c's agent is killed (SIGKILL) once its masked
    scales are on the exchange, after the others masked against it. At the deadline the coordinator
    leaves it out and sets attempt 2 with site-a and site-b, which mask both phases again under the
    next attempt's keys: the global model is their weighted average, within half a shared step."""
    sites = ("site-a", "site-b", "site-c")
    keys = {name: make_site_key(tmp_path / f"{name}.key") for name in sites}
    config = _config(tmp_path, keys)
    train, validation = site_corpus("site-a")  # site-c trains on site-a's corpus (two corpora are embedded)
    overrides = [f"data.train_files={train}", f"data.validation_files={validation}", *SITE_OVERRIDES]
    config["sites"].append(
        {"name": "site-c", "overrides": overrides, "steps_per_round": 2, "public_key": keys["site-c"]}
    )
    # three agents' evaluations, trainings and scales fit in 60 s on an idle machine, 6 process starts on a loaded one
    config.update(aggregation={"min_sites": 2}, round_deadline=f"{deadline_seconds(60, starts=6)}s")
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    codes = _run_federation(tmp_path, keys, fault={"site-c": "secure.scales@1"})
    assert codes == {"coordinator": 0, "site-a": 0, "site-b": 0, "site-c": -9}, codes
    fed = tmp_path / "fed"
    averaged = json.loads((fed / "round-001" / "averaged.json").read_text())
    assert averaged["secure_aggregation"]["attempt"] == 2 and averaged["secure_aggregation"]["sites"] == [
        "site-a",
        "site-b",
    ]
    assert list(averaged["left_out"]) == ["site-c"] and averaged["left_out"]["site-c"].startswith("late:")
    _average_within_half_a_step(tmp_path, averaged["weights"])
    # one more upload of both phases by each remaining site; site-c's scales of attempt 1 only
    exchange = tmp_path / "exchange" / "sites"
    for site in ("site-a", "site-b"):
        assert sorted(p.name for p in (exchange / site).glob("*-001-*.json")) == [
            "scales-001-1.json", "scales-001-2.json", "values-001-1.json", "values-001-2.json"]  # fmt: skip
    assert sorted(p.name for p in (exchange / "site-c").glob("*-001-*.json")) == ["scales-001-1.json"]
    for path in fed.rglob("*"):
        assert path.name not in ("transfer.safetensors", "residual.safetensors", "supertune-transfer.json"), path


def test_a_peer_key_that_is_not_the_pinned_one_stops_the_agent_naming_the_site(tmp_path: Path) -> None:
    from supertune.exchange import Exchange, parse_exchange
    from supertune.federation.config.executors import executor_kind
    from supertune.federation.config.load import load_federation
    from supertune.federation.executors.agents import exchange_layout as names
    from supertune.federation.executors.agents.secure_site import peer_keys, post_key
    from supertune.transfer.secure_masks import new_private_key, read_public_key

    keys = {name: make_site_key(tmp_path / f"{name}.key") for name in ("site-a", "site-b")}
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(_config(tmp_path, keys), sort_keys=False))
    fed, _ = load_federation(tmp_path / "federation.yaml")
    # --dry-run names the agent's command with its key
    assert executor_kind(fed).place(fed, fed.sites[0]).endswith(f"--site site-a {fed.exchange} --key KEYFILE)")
    sites = ("site-a", "site-b")
    with Exchange(parse_exchange(fed.exchange)) as exchange:
        post_key(exchange, "site-b", 1, (tmp_path / "site-b.key").read_bytes())
        assert peer_keys(exchange, fed, "site-a", 1, sites, 0.01) == {"site-b": read_public_key(keys["site-b"])}
        # another key posted for site-b in round 2 (a coordinator standing in the middle, say)
        post_key(exchange, "site-b", 2, new_private_key())
        with pytest.raises(UserError) as info:
            peer_keys(exchange, fed, "site-a", 2, sites, 0.01)
        posted = exchange.get_json(names.site_key("site-b", 2))["public_key"]
    text = str(info.value)
    assert "\n" not in text
    assert text == (
        f"sites (site-b).public_key: the key posted for site site-b in round 2 is {posted}, not the pinned "
        f"{keys['site-b']}; nothing is masked or sent (check the exchange and the federation config)"
    )
    assert not list((tmp_path / "exchange").rglob("*.upload"))


def test_a_secure_round_below_its_quorum_stops_and_starts_again_under_new_keys(tmp_path: Path) -> None:
    """In one process, against a directory exchange: site a's agent reports a failed training, b and c
    send nothing by the 2 s deadline. The round stops in one line below its quorum, forgets its start,
    and leaves the next attempt's number on the exchange with no set: run again, the round masks as
    attempt 2 with every site, never under attempt 1's keys again."""
    from supertune.exchange import Exchange, parse_exchange
    from supertune.federation.config.schema import (
        AggregationConfig,
        FederationConfig,
        PrivacyConfig,
        SiteConfig,
        TransferConfig,
    )
    from supertune.federation.executors.agents import exchange_layout as names
    from supertune.federation.executors.agents.coordinator import AgentsExecutor
    from supertune.federation.rounds.loop import RoundWork, SiteWork
    from supertune.federation.state.layout import FederationDir

    sites = [SiteConfig(name=n) for n in ("a", "b", "c")]
    fed = FederationConfig(name="q", rounds=1, executor="agents", exchange=str(tmp_path / "exchange"), poll_seconds=1,
                           round_deadline="2s", aggregation=AggregationConfig(min_sites=2), sites=sites,
                           transfer=TransferConfig(delta=True, dtype="int8"),
                           privacy=PrivacyConfig(secure_aggregation=True))  # fmt: skip
    root = FederationDir(tmp_path / "fed")
    root.config.parent.mkdir(parents=True)
    root.config.write_text("name: q\n")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    exchange = Exchange(parse_exchange(fed.exchange))
    coordinator = AgentsExecutor(fed, root)
    rd = root.round(1)
    train = [SiteWork(s, 1, tmp_path / "x.yaml", rd.site(s.name).path, receipt=rd.site(s.name).trained) for s in sites]
    work = RoundWork(1, base, rd.global_model, rd.averaged, train=train, trained={w.name: w.receipt for w in train})
    start = coordinator._put_start(1)
    report = {"round": 1, "start": start["unix"], "reason": "failed: exit 1", "tries": 2, "attempts": []}
    exchange.put_json(names.site_failed("a", 1), report)
    with pytest.raises(UserError) as stopped:
        coordinator.run_round(work)
    text = str(stopped.value)
    assert "\n" not in text and text.startswith(
        "round 1: 0 of 3 sites are left in its secure sum and the round needs 2 (aggregation.min_sites, 2 at least: "
        "a sum of one site is its change); a: failed: exit 1; b: late: no masked upload at the exchange after 2s; "
        "c: late: no masked upload at the exchange after 2s; run `supertune federate "
    ), text
    assert exchange.get_json(names.secure_set(1)) == {"round": 1, "attempt": 2, "sites": []}
    assert not rd.started.exists() and not list(rd.path.rglob("left_out.json"))
    with pytest.raises(UserError, match="0 of 3 sites are left in its secure sum"):
        coordinator.run_round(work)  # a new start: attempt 2 with every site, which all miss its deadline too
    assert exchange.get_json(names.secure_set(1)) == {"round": 1, "attempt": 3, "sites": []}
