"""mode: buffered without training: the staleness formulas, the settings' checks (every problem at once,
each naming its field), the refusals of what buffered rounds do not do yet, the receipts' checks, and
the version buffer's bookkeeping from a record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from supertune.config.errors import ConfigError
from supertune.errors import UserError
from supertune.federation.config.load import load_federation
from supertune.federation.config.staleness import STALENESS, staleness_problems, staleness_weight


def test_staleness_formulas() -> None:
    assert [staleness_weight("constant", 0.5, 4, u) for u in (0, 1, 7)] == [1.0, 1.0, 1.0]
    # polynomial: (u + 1)^-a
    assert staleness_weight("polynomial", 0.5, 4, 0) == 1.0
    assert staleness_weight("polynomial", 0.5, 4, 3) == pytest.approx(0.5)
    assert staleness_weight("polynomial", 2.0, 4, 1) == pytest.approx(0.25)
    # hinge: 1 up to b, then 1 / (a (u - b) + 1)
    assert [staleness_weight("hinge", 0.5, 2, u) for u in (0, 1, 2)] == [1.0, 1.0, 1.0]
    assert staleness_weight("hinge", 0.5, 2, 4) == pytest.approx(1 / 2)
    assert staleness_weight("hinge", 2.0, 1, 3) == pytest.approx(1 / 5)
    for kind in STALENESS:  # never more than a fresh change, never increasing with staleness
        weights = [staleness_weight(kind, 0.7, 2, u) for u in range(12)]
        assert weights[0] == 1.0 and all(a >= b > 0 for a, b in zip(weights, weights[1:]))
    with pytest.raises(ValueError):
        staleness_weight("polynomial", 0.5, 4, -1)


def test_staleness_parameters_are_checked_for_the_kind_that_reads_them() -> None:
    assert staleness_problems("constant", -1, -1) == []  # reads neither
    assert [p.split(":")[0] for p in staleness_problems("polynomial", 0, -1)] == ["aggregation.staleness.a"]
    assert [p.split(":")[0] for p in staleness_problems("hinge", math.inf, -2)] == [
        "aggregation.staleness.a",
        "aggregation.staleness.b",
    ]


def _write(tmp_path: Path, **settings) -> Path:
    config = {
        "name": "buffered",
        "mode": "buffered",
        "sites": [{"name": "a"}, {"name": "b"}],
        **settings,
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_buffered_settings_load(tmp_path: Path) -> None:
    fed, _ = load_federation(
        _write(
            tmp_path, aggregation={"buffer_size": 3, "max_staleness": 4, "staleness": {"kind": "hinge", "a": 1, "b": 2}}
        )
    )
    assert fed.mode == "buffered" and fed.aggregation.buffer_size == 3 and fed.aggregation.max_staleness == 4
    assert (fed.aggregation.staleness.kind, fed.aggregation.staleness.a, fed.aggregation.staleness.b) == ("hinge", 1, 2)


def test_every_bad_buffered_setting_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        aggregation={"buffer_size": 0, "max_staleness": -1, "staleness": {"kind": "polynomial", "a": -0.5}},
    )
    with pytest.raises(ConfigError) as refused:
        load_federation(path)
    fields = [p.split(":")[0] for p in refused.value.problems]
    assert fields == ["aggregation.buffer_size", "aggregation.max_staleness", "aggregation.staleness.a"]


def test_an_unknown_staleness_kind_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(UserError) as refused:
        load_federation(_write(tmp_path, aggregation={"staleness": {"kind": "exponential"}}))
    assert "aggregation.staleness.kind" in str(refused.value) and "hinge" in str(refused.value)


def test_what_buffered_rounds_do_not_do_yet_is_refused_one_line_each(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        site_retries=1,  # carried out: a failed task is tried again
        round_deadline="1h",
        benchmarks=["supertune_corpus"],
        optimizer_state="kept",
        aggregation={"min_sites": 1},
        transfer={"dtype": "bf16"},
    )
    with pytest.raises(ConfigError) as refused:
        load_federation(path)
    lines = refused.value.problems
    assert all("\n" not in line and "mode: buffered" in line for line in lines), lines
    assert sorted(line.split(":")[0] for line in lines) == sorted(
        ["aggregation.min_sites", "round_deadline", "transfer", "benchmarks", "optimizer_state"]
    )


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"executor": "agents", "exchange": "/tmp/exchange"}, "executor"),
        ({"executor": "streamflow"}, "executor"),
        ({"sites": [{"name": "a", "where": "leonardo"}, {"name": "b"}]}, "sites[0] (a).where"),
        ({"sites": [{"name": "a"}, {"name": "b", "from_round": 2}]}, "sites[1] (b).from_round/until_round"),
    ],
    ids=["agents", "streamflow", "slurm-site", "from-round"],
)
def test_executors_and_sites_buffered_rounds_cannot_use_are_refused(tmp_path: Path, settings: dict, field: str) -> None:
    with pytest.raises(UserError) as refused:
        load_federation(_write(tmp_path, **settings))
    problems = getattr(refused.value, "problems", [str(refused.value)])
    assert any(p.startswith(f"{field}:") and "mode: buffered" in p for p in problems), problems


def test_buffered_keys_in_a_synchronous_federation_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, mode="synchronous", aggregation={"buffer_size": 4, "max_staleness": 2})
    with pytest.raises(ConfigError) as refused:
        load_federation(path)
    assert [p.split(":")[0] for p in refused.value.problems] == ["aggregation.buffer_size", "aggregation.max_staleness"]
    assert all("mode: buffered" in p for p in refused.value.problems)


def test_lora_sites_are_refused_in_buffered_mode() -> None:
    from supertune.config.schema import RunConfig
    from supertune.federation.config.lora_modes import lora_problems
    from supertune.federation.config.schema import FederationConfig

    cfg = RunConfig()
    cfg.model.lora.enabled = True
    problems = lora_problems(FederationConfig(mode="buffered"), ["a", "b"], [cfg, cfg])
    assert len(problems) == 1 and problems[0].startswith("model.lora.enabled:") and "mode: buffered" in problems[0]


def test_arrival_receipts_are_checked_when_written_and_read(tmp_path: Path) -> None:
    from supertune.federation.state.receipts import read_arrival, write_arrival
    from supertune.federation.state.records import Arrival

    arrival = Arrival(1, "a", 1, 0, 1, 1, 100, 4, 70.7, False, "/c", "/s", 1.0)
    path = tmp_path / "arrivals" / "arrival-000001.json"
    write_arrival(path, arrival)
    assert read_arrival(path) == arrival
    data = json.loads(path.read_text())
    data["dropped"] = "no"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="dropped"):
        read_arrival(path)
    with pytest.raises(UserError, match="not written"):
        write_arrival(
            tmp_path / "arrival-000002.json", Arrival(2, "a", 1, 0, 1, -1, 1, None, 1.0, False, "/c", None, 1.0)
        )


def test_the_buffer_groups_the_changes_not_dropped_k_at_a_time(tmp_path: Path) -> None:
    from supertune.federation.config.schema import FederationConfig
    from supertune.federation.rounds.buffer import VersionBuffer
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.receipts import write_arrival
    from supertune.federation.state.records import Arrival

    fed = FederationConfig(mode="buffered", rounds=5)
    fed.aggregation.buffer_size = 2
    root = FederationDir(tmp_path)
    dropped = {3}
    for n in range(1, 7):
        write_arrival(root.arrival(n), Arrival(n, "a", n, 0, 0, 0, 10, None, 10.0, n in dropped, "/c", "/s", 1.0))
    buffer = VersionBuffer(fed, root, tmp_path / "base")
    assert [[a.number for a in g] for g in buffer.groups()] == [[1, 2], [4, 5], [6]]
    assert buffer.published == 0 and buffer.contributed("a") == {1, 2, 3, 4, 5, 6}


def test_plan_and_skip_site_are_refused_in_one_line(tmp_path: Path) -> None:
    from supertune.federation.config.load import federation_text
    from supertune.federation.run import federate, federation_cost_plan

    path = _write(tmp_path)
    with pytest.raises(UserError, match=r"^--plan: .*mode: buffered"):
        federation_cost_plan(str(path), None)
    fed_dir = tmp_path / "fed"
    fed_dir.mkdir()
    (fed_dir / "federation.yaml").write_text(federation_text(load_federation(path)[0]), encoding="utf-8")
    with pytest.raises(UserError, match=r"^--skip-site: mode: buffered") as refused:
        federate(str(fed_dir), None, skip=["a"])
    assert "\n" not in str(refused.value)


def test_every_mode_the_schema_accepts_has_its_record() -> None:
    import typing

    from supertune.federation.config.schema import FederationConfig
    from supertune.federation.modes import MODES

    accepted = typing.get_args(typing.get_type_hints(FederationConfig)["mode"])
    assert set(accepted) == set(MODES) and all(MODES[name].name == name for name in MODES)


def test_a_site_dropped_from_a_buffered_federation_is_dropped_from_the_next_version(tmp_path) -> None:
    """The versions published so far are finished rounds (published.json, as averaged.json is for a
    synchronous round): a site dropped after two of four versions is dropped from version 3 on."""
    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.state.history import drop_sites, dropped_sites, first_unfinished_round
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.receipts import write_published
    from supertune.federation.state.records import PublishedVersion

    fed = FederationConfig(mode="buffered", rounds=4, sites=[SiteConfig(name=n) for n in ("a", "b", "c")])
    root = FederationDir(tmp_path)
    assert first_unfinished_round(fed, root) == 1
    for n in (1, 2):
        published = PublishedVersion(n, str(root.round(n).global_model), "base", [2 * n - 1, 2 * n], [0.5, 0.5], 1.0)
        write_published(root.round(n).published, published)
    assert first_unfinished_round(fed, root) == 3
    drop_sites(fed, root, ["c"])
    assert dropped_sites(root)["c"]["from_round"] == 3
