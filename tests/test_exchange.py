"""A federation's exchange (docs/federated/agents.md, "The exchange"): files put and got whole and verified,
over a real OpenSSH server on loopback (tests/ssh_server.py) and through a directory; a connection
dropped in the middle of a transfer resumes where the bytes stopped; a damaged partial is sent again;
a file that does not match its manifest is refused; `supertune doctor --exchange` measures the link."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supertune.errors import UserError
from supertune.exchange import Exchange, parse_exchange

MB = 1_000_000


def _random_file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["directory", "ssh"])
def exchange_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "directory":
        return str(tmp_path / "exchange")
    server = request.getfixturevalue("ssh_server")
    monkeypatch.setenv("SUPERTUNE_SSH", server.ssh)
    return f"{server.url}{tmp_path / 'exchange'}"


def test_a_file_is_put_and_got_whole_and_verified(tmp_path, exchange_url):
    sha = _random_file(tmp_path / "model.safetensors", 3 * MB)
    said: list[str] = []
    with Exchange(parse_exchange(exchange_url), report=said.append) as exchange:
        put = exchange.put_file(tmp_path / "model.safetensors", "round-001/global/model.safetensors")
        assert (put["size"], put["sha256"], put["sent"]) == (3 * MB, sha, 3 * MB)
        # only the whole file, under its own name, is on the exchange host
        # (the ssh exchange is on this machine too, on loopback)
        assert sorted(p.name for p in (tmp_path / "exchange" / "round-001" / "global").iterdir()) == [
            "model.safetensors"
        ]
        got = exchange.get_file("round-001/global/model.safetensors", tmp_path / "back" / "m.safetensors", 3 * MB, sha)
        assert (
            got["got"] == 3 * MB
            and (tmp_path / "back" / "m.safetensors").read_bytes() == (tmp_path / "model.safetensors").read_bytes()
        )
        # a file whose manifest says otherwise is refused by name, and nothing is left where it would go
        with pytest.raises(
            UserError, match=r"round-001/global/model.safetensors does not match its manifest \(sha256\) twice"
        ):
            exchange.get_file("round-001/global/model.safetensors", tmp_path / "other", 3 * MB, "0" * 64)
        assert not list(tmp_path.glob("other*"))
        with pytest.raises(ValueError):
            exchange.path("../outside")
    assert any("put round-001/global/model.safetensors: 3.0 of 3.0 MB (100%)" in line for line in said), said


def test_a_partial_that_does_not_match_is_sent_again(tmp_path):
    sha = _random_file(tmp_path / "f", 2 * MB)
    target = tmp_path / "exchange" / "f"
    target.parent.mkdir()
    # wrong bytes (the rest is appended, the whole then differs); more bytes than the file has
    for garbage, retried in ((os.urandom(MB), True), (os.urandom(3 * MB), False)):
        Path(str(target) + ".partial").write_bytes(garbage)
        said: list[str] = []
        with Exchange(parse_exchange(str(tmp_path / "exchange")), backoff=0.01, report=said.append) as exchange:
            exchange.put_file(tmp_path / "f", "f")
        assert hashlib.sha256(target.read_bytes()).hexdigest() == sha and not Path(str(target) + ".partial").exists()
        assert any("arrived with another sha256; sending it again" in line for line in said) == retried, said
        target.unlink()


def test_a_connection_dropped_in_the_middle_resumes_where_the_bytes_stopped(tmp_path, ssh_server, monkeypatch):
    """The first upload's connection ends after 1 MB of 3 (ssh's exit code 255, as when a VPN drops):
    the second attempt sends only what is missing."""
    flaky = tmp_path / "flaky-ssh"
    flaky.write_text(
        "#!/bin/sh\n"
        f'if [ ! -e "{tmp_path}/dropped" ] && echo "$*" | grep -q "cat >>"; then\n'
        f'  touch "{tmp_path}/dropped"; head -c 1000000 | {ssh_server.ssh} "$@"; exit 255\n'
        "fi\n"
        f'exec {ssh_server.ssh} "$@"\n'
    )
    flaky.chmod(0o755)
    monkeypatch.setenv("SUPERTUNE_SSH", str(flaky))
    sha = _random_file(tmp_path / "model", 3 * MB)
    said: list[str] = []
    url = f"{ssh_server.url}{tmp_path / 'exchange'}"
    with Exchange(parse_exchange(url), backoff=0.1, report=said.append) as exchange:
        put = exchange.put_file(tmp_path / "model", "site-a/model")
    assert (tmp_path / "dropped").exists()
    assert any("the connection dropped" in line and "trying again in 0 s" in line for line in said), said
    assert "put site-a/model: resuming at 1.0 of 3.0 MB" in said, said
    assert hashlib.sha256((tmp_path / "exchange" / "site-a" / "model").read_bytes()).hexdigest() == sha == put["sha256"]


def test_doctor_measures_the_link_to_the_exchange_and_leaves_nothing_there(tmp_path, ssh_server, monkeypatch):
    url = f"{ssh_server.url}{tmp_path / 'exchange'}"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "doctor", "--exchange", url, "--probe-mb", "2", "--json"],
        capture_output=True, text=True, env=ssh_server.env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["url"] == url and result["probe_bytes"] == 2 * MB
    assert (
        result["upload_mb_s"] > 0
        and result["download_mb_s"] > 0
        and 0 < result["round_trip_s"] < result["connect_s"] + 60
    )
    assert list((tmp_path / "exchange").iterdir()) == []
    text = subprocess.run([sys.executable, "-m", "supertune", "doctor", "--exchange", url, "--probe-mb", "1"],
                          capture_output=True, text=True, env=ssh_server.env, timeout=120)  # fmt: skip
    assert text.returncode == 0 and "round trip" in text.stdout and "upload" in text.stdout and "MB/s" in text.stdout
    # unreachable, or not an address: one line each
    closed = url.replace(url.split(":")[2].split("/")[0], "1")
    for bad, said in ((closed, "the connection failed 2 times"), ("http://host/p", "only ssh:// addresses")):
        proc = subprocess.run([sys.executable, "-m", "supertune", "doctor", "--exchange", bad],
                              capture_output=True, text=True, env=ssh_server.env, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # an outage is its own error, which a site agent's chain of jobs waits out (agent_chain.OUTAGE_EXIT)
    from supertune.exchange import Exchange, ExchangeUnreachable, parse_exchange

    monkeypatch.setenv("SUPERTUNE_SSH", ssh_server.ssh)
    with pytest.raises(ExchangeUnreachable, match="the connection failed 1 times"):
        Exchange(parse_exchange(closed), retries=0).ping()


@pytest.mark.parametrize(("text", "said"), [
    ("ssh://-oProxyCommand=x@host/p", "is not a plain login name"),
    ("ssh://host", "no absolute path after the host"),
    ("ssh://me:secret@host/p", "a password in the address"),
    ("ssh://host:99999/p", "the port is not a number from 1 to 65535"),
    ("ftp://host/p", "only ssh:// addresses"),
])  # fmt: skip
def test_an_exchange_address_that_is_none_is_refused_naming_the_form(text, said):
    with pytest.raises(UserError, match="give ssh://\\[user@\\]host\\[:port\\]/absolute/path") as info:
        parse_exchange(text)
    assert said in str(info.value)
    address = parse_exchange("ssh://me@vm.example.org:2222/srv/fed/")
    assert (address.destination, address.port, address.path) == ("me@vm.example.org", 2222, "/srv/fed")


def test_the_plan_forecasts_each_rounds_time_from_a_measured_link(tmp_path, ssh_server):
    """`doctor --exchange --out` measures the link, `federate --plan --link` turns it into each round's
    time: the bytes a site sends (int8 changes here) at the measured rates, plus the protocol's round trips."""
    url = f"{ssh_server.url}{tmp_path / 'exchange'}"
    link = tmp_path / "link.json"
    measured = subprocess.run(
        [sys.executable, "-m", "supertune", "doctor", "--exchange", url, "--probe-mb", "1", "--out", str(link)],
        capture_output=True, text=True, env=ssh_server.env, timeout=120,
    )  # fmt: skip
    assert measured.returncode == 0, measured.stderr
    rates = json.loads(link.read_text())
    config = {"rounds": 2, "sites": [{"name": "a"}, {"name": "b"}], "transfer": {"delta": True, "dtype": "int8"},
              "base_config_overrides": {"num_hidden_layers": 1}}  # fmt: skip
    (tmp_path / "federation.yaml").write_text(json.dumps(config))
    plan = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed"),
         "--plan", "--link", str(link)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    sent = int(plan.stdout.split("each site sends its change in int8, ")[1].split(" bytes")[0].replace(",", ""))
    upload = sent / (rates["upload_mb_s"] * 1e6) + 6 * rates["round_trip_s"]
    assert f"| 1 | a | - | {upload:.1f} |" in plan.stdout, plan.stdout
    assert (
        "dominant: " in plan.stdout and "without the training of a, b: no round of theirs to measure yet" in plan.stdout
    )
    assert not (tmp_path / "fed").exists()  # a plan writes nothing
    refused = subprocess.run([sys.executable, "-m", "supertune", "federate", "--plan", "--link", str(tmp_path / "federation.yaml")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (
        refused.returncode == 2
        and "--link: " in refused.stderr
        and "supertune doctor --exchange URL --out FILE" in refused.stderr
    )


def test_the_forecast_names_what_dominates_a_round_and_what_shortens_it():
    from supertune.federation.config.schema import FederationConfig, TransferConfig
    from supertune.federation.reports.round_forecast import Link, PlannedRow, forecast_lines

    link = Link("ssh://vm/srv/fed", round_trip_s=0.05, upload_mb_s=1.0, download_mb_s=10.0, source="link.json")
    # 13.5 GB up at 1 MB/s against 600 s of training: the upload dominates; int8 changes are the way out
    rows = [PlannedRow(1, "leonardo", 200, 13_500_000_000, 13_500_000_000, 3.0),
            PlannedRow(1, "karolina", 200, 13_500_000_000, 13_500_000_000, None)]  # fmt: skip
    text = "\n".join(forecast_lines(FederationConfig(), rows, link, average_s=60.0))
    assert "| 1 | leonardo | 600 | 13500.3 | 60.0 | 1350.3 |" in text, text
    assert "| 1 | karolina | - | 13500.3 | 660.0 | 1350.3 |" in text, text
    assert "dominant: upload; send less: transfer: {delta: true, dtype: int8}" in text
    with_int8 = FederationConfig(transfer=TransferConfig(delta=True, dtype="int8"))
    assert "transfer.dtype: int4 halves int8's bytes" in "\n".join(forecast_lines(with_int8, rows, link, 60.0))
    slow = [PlannedRow(1, "leonardo", 200, 1_000_000, 1_000_000, 30.0)]
    assert "dominant: train; the link is not what a round waits for" in "\n".join(
        forecast_lines(FederationConfig(), slow, link, 0.0)
    )


def test_agents_settings_are_checked_with_the_federation(tmp_path):
    from supertune.config.errors import ConfigError
    from supertune.federation.config.load import load_federation

    def problems(**config) -> str:
        path = tmp_path / "federation.yaml"
        path.write_text(json.dumps({"rounds": 1, "sites": [{"name": "a"}, {"name": "b"}], **config}))
        with pytest.raises(ConfigError) as info:
            load_federation(path)
        return str(info.value)

    assert "exchange: executor: agents needs the exchange the sites meet at" in problems(executor="agents")
    assert "exchange: only used with executor: agents" in problems(exchange=str(tmp_path))
    assert "exchange: 'ftp://x/y': only ssh:// addresses" in problems(executor="agents", exchange="ftp://x/y")
    # a quorum, retries and a deadline are an agents federation's too, checked as any federation's
    said = problems(executor="agents", exchange=str(tmp_path), aggregation={"min_sites": 0}, round_deadline="soon")
    assert "aggregation.min_sites: must be at least 1" in said and "round_deadline: 'soon' is not a duration" in said
    assert "not supported with executor: agents" not in said
    # an agent's config and cluster profile are at its site: the coordinator does not look for them here
    path = tmp_path / "ok.yaml"
    path.write_text(json.dumps({"executor": "agents", "exchange": str(tmp_path / "x"), "rounds": 1,
                                "sites": [{"name": "a", "config": "a.yaml", "where": "leonardo"}, {"name": "b"}]}))  # fmt: skip
    fed, _ = load_federation(path)
    assert fed.sites[0].config == "a.yaml"


def test_an_ssh_host_that_prints_text_of_its_own_is_refused_by_name(tmp_path, ssh_server, monkeypatch):
    """What ssh brings back is checked like any input: a login message printed before every command's
    output (a shell's startup file on the exchange host) is not a size or a sha256, and is named."""
    chatty = tmp_path / "chatty-ssh"
    chatty.write_text(f'#!/bin/sh\necho "Welcome to the exchange host"\nexec {ssh_server.ssh} "$@"\n')
    chatty.chmod(0o755)
    monkeypatch.setenv("SUPERTUNE_SSH", str(chatty))
    _random_file(tmp_path / "model", MB)
    url = f"{ssh_server.url}{tmp_path / 'exchange'}"
    with Exchange(parse_exchange(url), backoff=0.01) as exchange, pytest.raises(UserError) as caught:
        exchange.put_file(tmp_path / "model", "model")
    assert str(caught.value) == (
        f"exchange {url}: `wc -c` answered 'Welcome to the exchange host', not a size in bytes: the host prints "
        "text of its own on a command's output (a message from a shell's startup file?); `ssh HOST true` must print nothing"
    )
