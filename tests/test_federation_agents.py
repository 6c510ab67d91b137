"""Federations whose sites send compressed changes, and whose sites run agents that meet the
coordinator at an exchange (docs/federated/transfers.md, "Sending less", and docs/federated/agents.md, "Site agents").

One built-in federation (2 sites x 2 rounds, int8 changes with error feedback) is the reference: what
each site sent is what each round averaged, and a federation of site agents reaching the coordinator
over a real OpenSSH server (tests/ssh_server.py), one of them killed in the middle of its training
and started again, ends with the very same global model."""

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

from federation_cli import corpus_sites
from supertune.transfer import PACKAGE_MANIFEST
from transfer_decoding import decoded_change

pytestmark = pytest.mark.slow


def model(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _config(**extra) -> dict:
    return {"name": "sendless", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 2, "sites": corpus_sites(4),
            "transfer": {"delta": True, "dtype": "int8", "block_size": 64}, **extra}  # fmt: skip


@pytest.fixture(scope="module")
def builtin(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("builtin")
    (root / "federation.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(root / "federation.yaml"), "--dir", str(root / "fed")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "site-a round 2: sends" in proc.stderr and "its change in int8" in proc.stderr
    return root / "fed"


def test_a_federation_whose_sites_send_int8_changes(builtin: Path, tmp_path: Path) -> None:
    """What each site sent is what the round averaged (the global model is the previous one plus the
    weighted decoded changes), round 2's change carries round 1's residual, the bytes in the table are
    the packages', and a package killed while written is made again byte for byte."""
    fed = builtin
    model_bytes = sum(f.stat().st_size for f in (fed / "round-000" / "global").glob("*.safetensors"))
    for number in (1, 2):
        rd = fed / f"round-{number:03d}"
        averaged = json.loads((rd / "averaged.json").read_text())
        previous, now = model(fed / f"round-{number - 1:03d}" / "global"), model(rd / "global")
        expected = {n: previous[n].astype(np.float64) for n in previous}
        for site in ("site-a", "site-b"):
            sent = rd / site / "sent"
            assert averaged["sent_bytes"][site] == (sent / "transfer.safetensors").stat().st_size
            assert averaged["sent_bytes"][site] < 0.27 * model_bytes  # fp32 model: int8 is ~1/4 of it
            for n, d in decoded_change(sent, 64).items():
                expected[n] += averaged["weights"][site] * d
        assert max(float(np.abs(now[n] - expected[n]).max()) for n in now) < 1e-6
    # error feedback: round 2's change (decoded, plus what it kept) is the site's true change plus round 1's residual
    site = fed / "round-002" / "site-a"
    trained = json.loads((site / "trained.json").read_text())
    x = load_file(str(Path(trained["checkpoint"]) / "model.safetensors"))
    g1 = model(fed / "round-001" / "global")
    r1 = load_file(str(fed / "round-001" / "site-a" / "sent" / "residual.safetensors"))
    r2 = load_file(str(site / "sent" / "residual.safetensors"))
    d2 = decoded_change(site / "sent", 64)
    assert max(float(np.abs(d2[n] + r2[n] - (x[n] - g1[n] + r1[n])).max()) for n in r2) < 1e-6
    assert max(float(np.abs(r1[n]).max()) for n in r1) > 0
    # A federation killed while a package is written (SIGKILL in the middle of its tensors) makes it
    # again from the same inputs, byte for byte: the half-written staging directory is cleared.
    table = json.loads((fed / "rounds.json").read_text())
    assert [r["sent_bytes"] for r in table["rows"]] == [averaged["sent_bytes"]["site-a"]] * 4
    again = tmp_path / "again"
    (again / "round-002" / "site-a").mkdir(parents=True)
    (again / "round-001" / "site-a").mkdir(parents=True)
    os.symlink(fed / "round-001" / "site-a" / "sent", again / "round-001" / "site-a" / "sent")
    send = (
        "import sys; from pathlib import Path; from supertune.federation.state.layout import FederationDir; "
        "from supertune.federation.config.load import load_federation; from supertune.federation.rounds.site_result import send_result; "
        "fed, _ = load_federation(sys.argv[1]); "
        "send_result(fed, FederationDir(sys.argv[2]), 2, 'site-a', sys.argv[3], Path(sys.argv[4]))"
    )
    argv = [sys.executable, "-c", send, str(fed), str(again), trained["checkpoint"], str(fed / "round-001" / "global")]
    killed = subprocess.run(
        argv, env=dict(os.environ, SUPERTUNE_FAULT="transfer.tensor@5"), capture_output=True, timeout=300
    )
    assert killed.returncode == -9 and list((again / "round-002" / "site-a").glob(".sent.partial-*"))
    assert subprocess.run(argv, capture_output=True, timeout=300).returncode == 0
    assert not list((again / "round-002" / "site-a").glob(".sent.partial-*"))
    for f in ("transfer.safetensors", "residual.safetensors", PACKAGE_MANIFEST):
        assert (again / "round-002" / "site-a" / "sent" / f).read_bytes() == (site / "sent" / f).read_bytes(), f
    # --plan counts what the packages weigh: the values (headers of the base's files) x 1 + 4/64 bytes
    plan = subprocess.run([sys.executable, "-m", "supertune", "federate", str(fed), "--plan"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    planned = int(plan.stdout.split("each site sends its change in int8, ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < averaged["sent_bytes"]["site-a"] - planned < 4096, plan.stdout


def test_site_agents_over_ssh_reach_the_builtin_global_model(builtin: Path, tmp_path: Path, ssh_server) -> None:
    """The same federation with executor: agents: the coordinator and two site agents (processes of
    their own, each with its own directory) meet at an exchange on a real sshd. Site-b's agent is
    killed (its whole process group) while it trains round 2 and started again: it picks up there. Every
    round's global model is the built-in federation's, tensor for tensor."""
    exchange = f"{ssh_server.url}{tmp_path / 'exchange'}"
    (tmp_path / "federation.yaml").write_text(
        yaml.safe_dump(_config(executor="agents", exchange=exchange, poll_seconds=1), sort_keys=False)
    )
    env = ssh_server.env

    def start(*args: str, log: str) -> subprocess.Popen:
        out = (tmp_path / log).open("w")
        return subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)  # fmt: skip

    coordinator = start(str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed"), log="coordinator.log")
    agent_a = start("--site", "site-a", exchange, "--dir", str(tmp_path / "agent-a"), log="a.log")
    agent_b = start("--site", "site-b", exchange, "--dir", str(tmp_path / "agent-b"), log="b.log")
    try:
        run = tmp_path / "agent-b" / "round-002" / "site-b" / "run"
        deadline = time.time() + 600
        while not (run / "metrics.jsonl").is_file() and time.time() < deadline:
            assert agent_b.poll() is None, (tmp_path / "b.log").read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(agent_b.pid, signal.SIGKILL)  # the agent and its training, as when its node is lost
        agent_b.wait()
        agent_b = start("--site", "site-b", exchange, "--dir", str(tmp_path / "agent-b"), log="b2.log")
        for proc, log in ((agent_a, "a.log"), (agent_b, "b2.log"), (coordinator, "coordinator.log")):
            assert proc.wait(timeout=900) == 0, (tmp_path / log).read_text()[-3000:]
    finally:
        for proc in (coordinator, agent_a, agent_b):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert "every round done" in (tmp_path / "b2.log").read_text()
    for number in (1, 2):
        ours, theirs = (
            model(tmp_path / "fed" / f"round-{number:03d}" / "global"),
            model(builtin / f"round-{number:03d}" / "global"),
        )
        assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours), number
    table = json.loads((tmp_path / "fed" / "rounds.json").read_text())
    reference = json.loads((builtin / "rounds.json").read_text())
    for key in ("tokens", "sent_bytes", "global", "local_after"):
        assert [r[key] for r in table["rows"]] == [r[key] for r in reference["rows"]], key
    assert all(r["node_hours"] and r["node_hours"] > 0 for r in table["rows"])  # the agents' attempts, as their cost
    # the coordinator never wrote a run: every site's training and residual stayed at its site
    assert not list((tmp_path / "fed").glob("round-*/*/run")) and not list(
        (tmp_path / "fed").glob("**/residual.safetensors")
    )
    assert list((tmp_path / "agent-b").glob("round-002/site-b/sent/residual.safetensors"))
