"""`supertune federate` in mode: buffered on this machine: three local sites training at once, one of
them 3x slower (three times the steps of the others per change, real work, no sleep). The fast sites
contribute more changes, the slow one's are staler, every arrival's weight is tokens x s(u) by the
formula, every version is the record's arrivals K at a time, the last version beats the base model on
every site, and a coordinator SIGKILLed while averaging, while publishing or while taking a change
resumes and publishes byte-identical versions from the recorded arrivals.

Three training processes at once on a small shared machine: each change costs a process start (tens
of seconds here) plus its steps, so this is one of the suite's slow tests (a few minutes)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from federation_cli import federate_cli
from supertune.federation.config.default import site_corpus
from supertune.federation.config.staleness import staleness_weight

TINY_SITE = [
    "generate.max_new_tokens=0",
    "training.report_to=[]",
    "training.logging_steps=4",
    "training.warmup_steps=0",
    "data.max_eval_samples=24",
]
FAST_STEPS = 4
SITES = (("fast-a", FAST_STEPS, "site-a"), ("fast-b", FAST_STEPS, "site-b"), ("slow", 3 * FAST_STEPS, "site-a"))
VERSIONS, K, A = 4, 2, 0.5


def _federation(tmp_path: Path) -> Path:
    sites = []
    for name, steps, corpus in SITES:
        train, validation = site_corpus(corpus)
        sites.append({
            "name": name,
            "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *TINY_SITE],
            "steps_per_round": steps,
        })  # fmt: skip
    config = {
        "name": "fed-buffered",
        "mode": "buffered",
        "base_config_overrides": {"num_hidden_layers": 1},
        "rounds": VERSIONS,
        "site_retries": 1,
        # a server optimizer with state: each version's momentum is read back by the next
        "aggregation": {
            "buffer_size": K,
            "server_optimizer": "fedavgm",
            "server_momentum": 0.5,
            "staleness": {"kind": "polynomial", "a": A},
        },
        "sites": sites,
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _arrivals(fed_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((fed_dir / "arrivals").glob("arrival-*.json"))]


def _version_files(fed_dir: Path) -> dict[str, bytes]:
    """Every published version's weights and server optimizer state, byte for byte."""
    return {
        str(p.relative_to(fed_dir)): p.read_bytes()
        for n in range(1, VERSIONS + 1)
        for p in sorted((fed_dir / f"round-{n:03d}" / "global").glob("*.safetensors"))
    }


@pytest.fixture(scope="module")
def buffered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The federation, whose slow site's first task is killed (SIGKILL) at step 1 of its first attempt:
    site_retries: 1 tries it again."""
    root = tmp_path_factory.mktemp("buffered")
    fed_dir = root / "fed"
    fault = {"SUPERTUNE_FAULT": "step@1", "SUPERTUNE_FAULT_IN": "buffered/slow/task-001/",
             "SUPERTUNE_FAULT_ONCE": str(root / "killed-once")}  # fmt: skip
    proc = federate_cli(str(_federation(root)), "--dir", str(fed_dir), env=fault)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "slow task 1: attempt 1 of 2 failed; trying again" in proc.stderr, proc.stderr[-4000:]
    return fed_dir


@pytest.mark.slow
def test_fast_sites_contribute_more_and_the_slow_one_is_staler(buffered: Path) -> None:
    arrivals = _arrivals(buffered)
    kept = [a for a in arrivals if not a["dropped"]]
    assert len(kept) >= VERSIONS * K
    count = {name: sum(a["site"] == name for a in kept[: VERSIONS * K]) for name, _, _ in SITES}
    assert count["fast-a"] > count["slow"] and count["fast-b"] > count["slow"] >= 1, count
    # Both fast sites publish version 1 before the slow site's first change arrives: it is 1 behind.
    first_slow = next(a for a in arrivals if a["site"] == "slow")
    assert first_slow["base_version"] == 0 and first_slow["staleness"] >= 1
    for a in arrivals:
        assert a["staleness"] == a["version"] - a["base_version"]
        steps = 3 * FAST_STEPS if a["site"] == "slow" else FAST_STEPS
        assert a["tokens"] == steps * 16 * 128  # steps x global batch x block
        assert a["weight"] == a["tokens"] * staleness_weight("polynomial", A, 0, a["staleness"])
        assert a["weight"] == pytest.approx(a["tokens"] * (a["staleness"] + 1) ** -A)


@pytest.mark.slow
def test_a_failed_task_is_tried_again_and_both_attempts_are_its_cost(buffered: Path) -> None:
    attempts = json.loads((buffered / "buffered" / "slow" / "task-001" / "cost.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed: killed by signal 9", "finished"], attempts
    assert all(a["end"] >= a["start"] for a in attempts)
    # the site's cost in the table: every attempt of every task, taken or stopped at the end
    sites = {s["site"]: s for s in json.loads((buffered / "rounds.json").read_text())["sites"]}
    tasks = list((buffered / "buffered" / "slow").glob("task-*"))
    assert sites["slow"]["attempts"] == len(tasks) + 1 and sites["slow"]["node_hours"] > 0, sites["slow"]
    assert all(s["node_hours"] > 0 for s in sites.values()), sites


@pytest.mark.slow
def test_each_version_is_the_records_arrivals_k_at_a_time(buffered: Path) -> None:
    kept = [a for a in _arrivals(buffered) if not a["dropped"]]
    for n in range(1, VERSIONS + 1):
        published = json.loads((buffered / f"round-{n:03d}" / "published.json").read_text())
        group = kept[(n - 1) * K : n * K]
        assert published["arrivals"] == [a["number"] for a in group]
        assert all(a["version"] == n - 1 for a in group)  # each change applied to the newest version
        total = sum(a["weight"] for a in group)
        assert published["weights"] == pytest.approx([a["weight"] / total for a in group])
        manifest = json.loads((buffered / f"round-{n:03d}" / "global" / "supertune-average.json").read_text())
        assert [i["directory"] for i in manifest["inputs"]] == [a["sent"] for a in group]
        assert (buffered / f"round-{n:03d}" / "global" / "server-momentum.safetensors").is_file()


def _weights(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(directory.glob("model*.safetensors")):
        out.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return out


@pytest.mark.slow
def test_each_version_applies_its_changes_to_the_newest_one_with_server_momentum(buffered: Path) -> None:
    """v_n = v_(n-1) + m_n, m_n = 0.5 m_(n-1) + sum_i share_i (site model_i - v_(base_i)): each change is
    taken from the version its site started from and added to the newest (fedavgm, momentum 0.5)."""
    arrivals = {a["number"]: a for a in _arrivals(buffered)}
    versions = [_weights(buffered / "round-000" / "global")]
    momentum: dict[str, np.ndarray] = {}
    for n in range(1, VERSIONS + 1):
        published = json.loads((buffered / f"round-{n:03d}" / "published.json").read_text())
        change = {k: np.zeros_like(v) for k, v in versions[-1].items()}
        for number, share in zip(published["arrivals"], published["weights"]):
            a = arrivals[number]
            site, base = _weights(Path(a["checkpoint"])), versions[a["base_version"]]
            for k in change:
                change[k] += share * (site[k] - base[k])
        momentum = {k: 0.5 * momentum.get(k, 0.0) + change[k] for k in change}
        expected = {k: versions[-1][k] + momentum[k] for k in change}
        got = _weights(buffered / f"round-{n:03d}" / "global")
        assert got.keys() == expected.keys()
        assert max(float(np.max(np.abs(got[k] - expected[k]))) for k in got) < 1e-5, n
        versions.append(got)


@pytest.mark.slow
def test_the_last_version_beats_the_base_model_on_every_site(buffered: Path) -> None:
    table = json.loads((buffered / "rounds.json").read_text())
    assert table["published"] == VERSIONS
    for site in table["sites"]:
        assert site["last_version_loss"] < table["base"][site["site"]], site
    status = federate_cli("--status", str(buffered))
    assert status.returncode == 0 and status.stdout == (buffered / "rounds.md").read_text()
    assert f"# Federation fed-buffered: {VERSIONS} of {VERSIONS} versions (mode: buffered)" in status.stdout
    row = next(a for a in _arrivals(buffered) if a["site"] == "slow")
    assert f"| {row['number']} | slow | 1 | 0 | {row['staleness']} | {row['tokens']:,} |" in status.stdout
    # rounds.png: versions over time with each site's changes, and each change's staleness, side by side
    with (buffered / "rounds.png").open("rb") as png:  # 12 x 4.5 inches at 110 dpi
        head = png.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1320, 495)
    from supertune.federation.config.load import load_federation
    from supertune.federation.reports.buffered_table import buffered_figure
    from supertune.federation.state.layout import FederationDir

    fig = buffered_figure(load_federation(str(buffered))[0], FederationDir(buffered))
    versions, stale = fig.axes
    drawn = {line.get_label(): line for line in versions.get_lines()}
    assert {"published version", "fast-a: its changes", "fast-b: its changes", "slow: its changes"} <= set(drawn)
    assert max(drawn["published version"].get_ydata()) == VERSIONS
    slow = next(line for line in stale.get_lines() if line.get_label() == "slow")
    assert sorted(slow.get_ydata()) == sorted(a["staleness"] for a in _arrivals(buffered) if a["site"] == "slow")


@pytest.mark.slow
def test_a_coordinator_killed_anywhere_publishes_the_same_versions(buffered: Path) -> None:
    """The record decides: with the versions gone and the last change's arrival receipt too (as if the
    coordinator had died between taking it and recording it), the coordinator is killed in the middle
    of an average, between a version and its receipt, and between taking that change and its receipt;
    resumed, it takes the change again, onto the same version, and publishes every version byte for
    byte as the uninterrupted run did, training nothing."""
    before = _version_files(buffered)
    assert len(before) == 2 * VERSIONS  # model and momentum of each version
    last = buffered / "arrivals" / f"arrival-{VERSIONS * K:06d}.json"
    recorded = json.loads(last.read_text())
    last.unlink()
    for n in range(1, VERSIONS + 1):
        shutil.rmtree(buffered / f"round-{n:03d}" / "global")
        (buffered / f"round-{n:03d}" / "published.json").unlink()
    for evaluated in (buffered / f"round-{VERSIONS:03d}").glob("*/evaluated.json"):
        evaluated.unlink()
    tasks = sorted(p.name for p in (buffered / "buffered").glob("*/task-*"))
    for fault in ("average.tensor@3", "federation.published@2", f"federation.arrival@{VERSIONS * K}"):
        killed = federate_cli(str(buffered), env={"SUPERTUNE_FAULT": fault})
        assert killed.returncode == -9, fault + killed.stderr[-2000:]
        if fault.startswith("federation.published"):
            assert (buffered / "round-001" / "published.json").is_file()
            assert not (buffered / "round-002" / "published.json").is_file()
            assert (buffered / "round-002" / "global").is_dir()
    assert not last.exists() and (buffered / f"round-{VERSIONS - 1:03d}" / "published.json").is_file()
    resumed = federate_cli(str(buffered))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "training here" not in resumed.stderr  # every version came from the recorded changes
    assert sorted(p.name for p in (buffered / "buffered").glob("*/task-*")) == tasks
    again = json.loads(last.read_text())
    assert {k: v for k, v in again.items() if k != "unix"} == {k: v for k, v in recorded.items() if k != "unix"}
    assert _version_files(buffered) == before
