"""`supertune federate` on this machine: two sites, each on its own corpus, two rounds; the table and
plot; resuming after a SIGKILL during a site's training and during the average reaches the same
global model as a federation that was never interrupted; every bad federation config at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from federation_cli import federate_cli
from federation_copies import copy_before_average, copy_through_round_one_training
from supertune.federation.config.default import site_corpus

TINY_SITE = [
    "generate.max_new_tokens=0",
    "training.report_to=[]",
    "training.logging_steps=4",
    "data.max_eval_samples=24",
]


def _federation(tmp_path: Path, rounds: int = 2, **extra) -> Path:
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        sites.append({
            "name": name,
            "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *TINY_SITE],
            "steps_per_round": 8,
        })  # fmt: skip
    config = {
        "name": "fed-test",
        "base_config_overrides": {"num_hidden_layers": 1},
        "rounds": rounds,
        "sites": sites,
        **extra,
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _global(directory: Path, number: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted((directory / f"round-{number:03d}" / "global").glob("*.safetensors")):
        if "momentum" not in f.name:
            out.update(load_file(f))
    return out


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("federation")
    fed_dir = root / "fed"
    # One small task of the embedded benchmark on every round's global model (about 2 s a round).
    proc = federate_cli(str(_federation(root, benchmarks=["supertune_corpus_nouns"])), "--dir", str(fed_dir))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return fed_dir


@pytest.mark.slow
def test_two_rounds_make_a_global_model_better_than_the_base_on_every_site(uninterrupted: Path) -> None:
    table = json.loads((uninterrupted / "rounds.json").read_text())
    assert [(r["round"], r["site"]) for r in table["rows"]] == [(n, s) for n in (1, 2) for s in ("site-a", "site-b")]
    for site in ("site-a", "site-b"):
        last = next(r for r in table["rows"] if r["round"] == 2 and r["site"] == site)
        assert last["global"] < table["base"][site], (site, last, table["base"])
        assert last["tokens"] == 8 * 16 * 128  # steps x global batch x block: packed, every token counts
        assert last["loss_tokens"] == 8 * 16 * 127  # the first token of each sequence predicts nothing


@pytest.mark.slow
def test_the_table_is_the_receipts(uninterrupted: Path) -> None:
    table = json.loads((uninterrupted / "rounds.json").read_text())
    for row in table["rows"]:
        rd = uninterrupted / f"round-{row['round']:03d}"
        trained = json.loads((rd / row["site"] / "trained.json").read_text())
        evaluated = json.loads((rd / row["site"] / "evaluated.json").read_text())
        before = json.loads(
            (uninterrupted / f"round-{row['round'] - 1:03d}" / row["site"] / "evaluated.json").read_text()
        )
        averaged = json.loads((rd / "averaged.json").read_text())
        assert row["tokens"] == trained["tokens"] and row["local_after"] == trained["eval_loss"]
        assert row["loss_tokens"] == trained["loss_tokens"]
        assert row["global"] == evaluated["eval_loss"] and row["local_before"] == before["eval_loss"]
        assert row["weight"] == averaged["weights"][row["site"]]
        # The site's training receipt points at the checkpoint the average used.
        manifest = json.loads((rd / "global" / "supertune-average.json").read_text())
        assert trained["checkpoint"] in [i["directory"] for i in manifest["inputs"]]
    markdown = (uninterrupted / "rounds.md").read_text()
    first = table["rows"][0]
    assert (
        f"| 1 | site-a | {first['tokens']:,} | {first['loss_tokens']:,} | {first['weight']:.4f} | {first['local_before']:.4f} | {first['local_after']:.4f} | {first['global']:.4f} |"
        in markdown
    )
    status = federate_cli("--status", str(uninterrupted))
    assert status.returncode == 0 and status.stdout == markdown


@pytest.mark.slow
def test_every_rounds_global_model_is_benchmarked_into_the_round_table(uninterrupted: Path) -> None:
    table = json.loads((uninterrupted / "rounds.json").read_text())
    assert sorted(table["benchmarks"]) == ["1", "2"]
    markdown = (uninterrupted / "rounds.md").read_text()
    assert "## Benchmarks of the global model\n\n| round | supertune_corpus_nouns acc |" in markdown
    for number, scores in table["benchmarks"].items():
        receipt = json.loads((uninterrupted / f"round-{int(number):03d}" / "benchmarks.json").read_text())
        assert receipt["scores"] == scores and 0 <= scores["supertune_corpus_nouns"]["acc"] <= 1
        assert f"| {number} | {scores['supertune_corpus_nouns']['acc']:.4f} |" in markdown
    # `supertune eval --tasks` on a round's global model records into the federation directory, marked with its round.
    records = [json.loads(line) for line in (uninterrupted / "benchmarks.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]


@pytest.mark.slow
def test_the_plot_is_a_picture_with_data(uninterrupted: Path) -> None:
    import matplotlib.image

    picture = matplotlib.image.imread(uninterrupted / "rounds.png")
    assert picture.shape[0] > 200 and picture.shape[1] > 300
    assert len(np.unique(picture.reshape(-1, picture.shape[-1]), axis=0)) > 20  # lines and text, not a blank page


@pytest.mark.slow
def test_running_a_finished_federation_again_redoes_nothing(
    uninterrupted: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `supertune federate DIR`'s code, run in this process each time.
    import logging

    from supertune.errors import UserError
    from supertune.federation.run import federate

    receipts = sorted(uninterrupted.rglob("*.json"))
    before = {
        p: p.stat().st_mtime_ns for p in receipts if p.name in ("trained.json", "averaged.json", "evaluated.json")
    }
    with caplog.at_level(logging.INFO, logger="supertune"):
        federate(str(uninterrupted), None)
    assert "resuming the federation" in caplog.text and "another run config" not in caplog.text
    assert {p: p.stat().st_mtime_ns for p in before} == before
    # A site's overrides edited in the federation's own federation.yaml are said to be not applied.
    config = uninterrupted / "federation.yaml"
    original = config.read_text()
    caplog.clear()
    try:
        edited = yaml.safe_load(original)
        edited["sites"][1]["overrides"].append("training.learning_rate=0.001")
        config.write_text(yaml.safe_dump(edited, sort_keys=False), encoding="utf-8")
        with caplog.at_level(logging.INFO, logger="supertune"):
            federate(str(uninterrupted), None)
    finally:
        config.write_text(original)
    assert "site site-b: federation.yaml now gives it another run config than " in caplog.text
    assert "site site-a: federation.yaml now" not in caplog.text
    # The finished federation's result deleted since: named, with the way out, not run over.
    last = uninterrupted / "round-002" / "global"
    last.rename(last.with_name("moved"))
    try:
        with pytest.raises(UserError) as gone:
            federate(str(uninterrupted), None)
    finally:
        last.with_name("moved").rename(last)
    assert str(gone.value).startswith(f"round 2: its global model {last}, recorded by ")
    assert "\n" not in str(gone.value)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["step@4", "average.tensor@3"], ids=["kill-in-local-training", "kill-in-averaging"])
def test_a_killed_federation_resumes_to_the_same_global_model(
    fault: str, uninterrupted: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Killed in round 1 and resumed (in this process), it reaches the uninterrupted federation's round-1
    # global model, from which every later round trains (a round's training does not depend on how many
    # rounds follow it). Killed in the average: a copy of the uninterrupted federation as it stood before
    # round 1's average, so the resume trains nothing again.
    import logging

    from supertune.federation.run import federate

    fed_dir = tmp_path / "fed"
    if fault.startswith("average."):
        copy_before_average(uninterrupted, fed_dir, 1)
        killed = federate_cli(str(fed_dir), env={"SUPERTUNE_FAULT": fault})
    else:
        killed = federate_cli(
            str(_federation(tmp_path, rounds=1)), "--dir", str(fed_dir), env={"SUPERTUNE_FAULT": fault}
        )
    assert killed.returncode != 0
    assert not (fed_dir / "round-001" / "averaged.json").exists()
    with caplog.at_level(logging.INFO, logger="supertune"):
        federate(str(fed_dir), None)
    assert ("training here" in caplog.text) == fault.startswith("step@")
    assert _max_difference(_global(fed_dir, 1), _global(uninterrupted, 1)) <= 1e-5


def test_every_problem_of_a_federation_config_at_once(tmp_path: Path) -> None:
    bad = {
        "name": "two words",
        "rounds": 0,
        "aggregation": {"server_momentum": 1.5, "weights": "tokenz"},
        "sites": [
            {"name": "a", "steps_per_round": 0, "where": "nowhere", "weight": 1.0},
            {"name": "a", "config": "missing.yaml", "login": "me@login.example.org"},
        ],
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    proc = federate_cli(str(path), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr
    assert "aggregation.weights: 'tokenz' is not one of tokens, samples, uniform" in err  # types first
    bad["aggregation"]["weights"] = "tokens"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    err = federate_cli(str(path), timeout=120).stderr
    for expected in (
        "name: 'two words' cannot name the federation's folder",
        "rounds: must be at least 1",
        "aggregation.server_momentum: must be in [0, 1)",
        "sites[0] (a).steps_per_round: must be at least 1",
        "sites[0] (a).where: unknown cluster 'nowhere'",
        "sites[1] (a).name: 'a' is used by another site",
        "sites[1] (a).config:",
        "sites[1] (a).login: only used with executor: streamflow",
        "sites[].weight: given for some sites only",
    ):
        assert expected in err, (expected, err)


def test_a_site_config_problem_names_the_site(tmp_path: Path) -> None:
    path = _federation(tmp_path, rounds=1)
    data = yaml.safe_load(path.read_text())
    data["sites"][1]["overrides"].append("training.learning_rate=-1")
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = federate_cli(str(path), "--dir", str(tmp_path / "fed"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "sites[1] (site-b): training.learning_rate: must be positive, got -1.0" in proc.stderr
    assert not (tmp_path / "fed" / "round-001").exists()


@pytest.mark.slow
def test_kept_optimizer_state_carries_the_moments_into_the_next_round(uninterrupted: Path, tmp_path: Path) -> None:
    """Round 1 trains the same with either optimizer_state (there is nothing to carry yet), so a copy of the
    uninterrupted federation through round 1's training, set to keep the moments, goes on into round 2."""
    import torch

    from supertune.federation.run import federate

    fed_dir = tmp_path / "fed"
    copy_through_round_one_training(uninterrupted, fed_dir, {})
    saved = yaml.safe_load((fed_dir / "federation.yaml").read_text())
    saved.update(rounds=2, optimizer_state="kept", benchmarks=[])
    (fed_dir / "federation.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    federate(str(fed_dir), None)
    for site in ("site-a", "site-b"):
        first = json.loads((fed_dir / "round-001" / site / "trained.json").read_text())
        second = json.loads((fed_dir / "round-002" / site / "trained.json").read_text())
        config = yaml.safe_load((fed_dir / "round-002" / site / "site.yaml").read_text())
        assert config["training"]["init_optimizer_from"] == first["checkpoint"]
        state = torch.load(Path(second["checkpoint"]) / "optimizer.pt", weights_only=True)["state"]
        # AdamW counts its steps per parameter: 8 of round 1 carried on, then 8 more.
        assert {int(s["step"]) for s in state.values()} == {16}


def test_the_key_reference_in_the_docs_is_current(repo: Path) -> None:
    from supertune.federation.docs import federation_keys_markdown

    assert federation_keys_markdown() in (repo / "docs" / "federated" / "config.md").read_text(encoding="utf-8"), (
        "docs/federated/config.md: replace the block between the federation keys markers with supertune.federation.docs.federation_keys_markdown()"
    )


def test_a_site_reached_over_ssh_is_checked_here_for_types_only(tmp_path: Path) -> None:
    """Its data lives at the site: paths that do not exist here pass, a wrong type does not."""
    from supertune.config.errors import ConfigError
    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.config.sites import resolve_sites

    remote = ["data.train_files=/site/scratch/corpus/*.jsonl", "data.validation_files=/site/scratch/valid.jsonl"]

    def fed(*extra: str) -> FederationConfig:
        return FederationConfig(executor="streamflow", sites=[
            SiteConfig(name="far", login="me@login.example.org", workdir="/site/work", overrides=[*remote, *extra]),
            SiteConfig(name="near", overrides=["generate.max_new_tokens=0"]),
        ])  # fmt: skip

    [far, _] = resolve_sites(fed())
    assert far.config.data.train_files == ["/site/scratch/corpus/*.jsonl"]  # as written: expanded at the site
    with pytest.raises(ConfigError) as refused:
        resolve_sites(fed("training.max_steps=abc"))
    assert "sites[0] (far): training.max_steps: expected an integer" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        resolve_sites(FederationConfig(sites=[SiteConfig(name="a", overrides=remote), SiteConfig(name="b")]))
    assert "sites[0] (a): data.train_files: glob '/site/scratch/corpus/*.jsonl' matches no file" in str(refused.value)


def test_a_warmup_as_long_as_a_round_is_warned_about_once_per_site(caplog: pytest.LogCaptureFixture) -> None:
    """Each round is a new run whose schedule starts again from warmup: with warmup_steps at or
    above steps_per_round the configured learning rate is never reached, and the log says so."""
    import logging

    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.config.sites import resolve_sites

    def fed(warmup: str) -> FederationConfig:
        return FederationConfig(sites=[
            SiteConfig(name="short", steps_per_round=8, overrides=[f"training.warmup_steps={warmup}", "training.learning_rate=1e-3"]),
            SiteConfig(name="long", steps_per_round=40, overrides=[f"training.warmup_steps={warmup}"]),
        ])  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="supertune"):
        resolve_sites(fed("10"))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("site short: training.warmup_steps=10 is not below steps_per_round=8")
    assert "never reaches training.learning_rate=0.001 (at most 0.0007)" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="supertune"):
        resolve_sites(fed("0.1"))  # a fraction of each round's steps: the peak is reached every round
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def _three_sites(tmp_path: Path, leave_out: str | None = None) -> Path:
    """Three local sites (site-c on a copy of site-b's corpus, which the test withdraws), one round of two steps."""
    import shutil

    sites = []
    for name, corpus in (("site-a", "site-a"), ("site-b", "site-b"), ("site-c", "site-b")):
        train, validation = site_corpus(corpus)
        if name == "site-c":
            train = tmp_path / "site-c-train.jsonl"
            if not train.exists():
                shutil.copy(site_corpus(corpus)[0], train)
        sites.append({"name": name, "steps_per_round": 2,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *TINY_SITE,
                                    "training.warmup_steps=0", "data.max_eval_samples=8"]})  # fmt: skip
    config = {"name": "fed-drop", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1,
              "sites": [s for s in sites if s["name"] != leave_out]}  # fmt: skip
    path = tmp_path / f"federation{'-without-' + leave_out if leave_out else ''}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_site_that_fails_for_good_is_shown_failed_and_dropped_with_its_rounds_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # After the first command (a real process, killed), the federation goes on in this process: the
    # commands' own code, without paying a start of torch for each refusal.
    import logging

    from supertune.errors import UserError
    from supertune.federation.run import federate

    fed_dir = tmp_path / "fed"
    # Every site trains round 1; the federation is killed while averaging it.
    killed = federate_cli(
        str(_three_sites(tmp_path)), "--dir", str(fed_dir), env={"SUPERTUNE_FAULT": "average.tensor@3"}
    )
    assert killed.returncode != 0 and (fed_dir / "round-001" / "site-c" / "trained.json").is_file()
    (tmp_path / "site-c-train.jsonl").unlink()  # site-c's data is withdrawn for good

    with pytest.raises(UserError) as failed:
        federate(str(fed_dir), None)
    assert str(failed.value).startswith("sites[2] (site-c): data.train_files: file"), failed.value
    status = federate_cli("--status", str(fed_dir))
    assert status.returncode == 0 and "- FAILED round 1, site site-c (" in status.stdout, status.stdout
    assert "not finished): sites[2] (site-c): data.train_files: file" in status.stdout

    # Leaving the site out of the YAML is refused, with the way to drop it; so is a name that is no site.
    with pytest.raises(UserError, match=f"run `supertune federate {fed_dir} --drop site-c`"):
        federate(str(_three_sites(tmp_path, leave_out="site-c")), str(fed_dir))
    with pytest.raises(UserError, match="--drop: 'site-d' is not a site of this federation"):
        federate(str(fed_dir), None, ["site-d"])

    with caplog.at_level(logging.WARNING, logger="supertune"):
        federate(str(fed_dir), None, ["site-c"])
    assert "site site-c: dropped from round 1 on" in caplog.text
    averaged = json.loads((fed_dir / "round-001" / "averaged.json").read_text())
    assert set(averaged["weights"]) == {"site-a", "site-b"}
    # The history keeps the dropped site: the config, its base loss, its training of round 1, the drop.
    assert [s["name"] for s in yaml.safe_load((fed_dir / "federation.yaml").read_text())["sites"]] == [
        "site-a", "site-b", "site-c"]  # fmt: skip
    table = json.loads((fed_dir / "rounds.json").read_text())
    assert [(r["round"], r["site"], r["weight"] is None) for r in table["rows"]] == [
        (1, "site-a", False), (1, "site-b", False), (1, "site-c", True)]  # fmt: skip
    assert table["base"]["site-c"] is not None
    status = federate_cli("--status", str(fed_dir)).stdout
    assert "- site-c: dropped from round 1 on (" in status and "the round finished later): sites[2] (site-c)" in status
    with pytest.raises(UserError) as again:
        federate(str(fed_dir), None, ["site-a"])
    assert str(again.value).startswith("--drop: the federation in") and "has finished all its 1 rounds" in str(
        again.value
    )


def test_dropping_is_refused_for_a_name_that_is_no_site_and_for_the_last_one(tmp_path: Path) -> None:
    from supertune.errors import UserError
    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.state.history import active_federation, drop_sites, dropped_sites
    from supertune.federation.state.layout import FederationDir

    fed = FederationConfig(rounds=2, sites=[SiteConfig(name="a"), SiteConfig(name="b"), SiteConfig(name="c")])
    root = FederationDir(tmp_path)
    with pytest.raises(UserError, match="--drop: 'd' is not a site of this federation; its sites are a, b, c"):
        drop_sites(fed, root, ["d"])
    drop_sites(fed, root, ["c"])
    assert dropped_sites(root)["c"]["from_round"] == 1 and [s.name for s in active_federation(fed, root).sites] == [
        "a",
        "b",
    ]
    drop_sites(fed, root, ["b"])  # a two-site federation survives a site lost for good: one goes on alone
    assert [s.name for s in active_federation(fed, root).sites] == ["a"]
    with pytest.raises(UserError, match=r"--drop: a would leave no site; a federation needs one site still training"):
        drop_sites(fed, root, ["a"])
    assert set(dropped_sites(root)) == {"b", "c"}  # a refusal writes nothing


def test_a_round_with_one_site_left_makes_its_model_the_global_one(tmp_path: Path) -> None:
    """The average of the one site left is its own model, tensor for tensor, through the round's
    averaging (checks, writer, receipt); a user's `supertune average` of one model stays refused."""

    sys.path.insert(0, str(Path(__file__).parent))
    from average_models import make_checkpoint, save_model, tensors
    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.rounds.phases import average_round

    site = make_checkpoint(save_model(tmp_path / "site-a", 3), tokens=640, samples=5)
    fed = FederationConfig(rounds=2, sites=[SiteConfig(name="site-a")])
    record = average_round(
        fed, 2, ["site-a"], [str(site)], tmp_path / "previous", tmp_path / "global", tmp_path / "averaged.json"
    )
    assert record["weights"] == {"site-a": 1.0} and record["tokens"] == {"site-a": 640}
    ours, theirs = tensors(tmp_path / "global"), tensors(site)
    assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)


# FSDP sites averaged from their sharded checkpoints, two rounds: tests/recipes/test_recipe_two_site_llama.py.
def test_kept_optimizer_state_is_refused_at_an_fsdp_site() -> None:
    from supertune.config.errors import ConfigError
    from supertune.federation.config.schema import FederationConfig, SiteConfig
    from supertune.federation.config.sites import resolve_sites

    sites = [SiteConfig(name="a", overrides=["distributed.strategy=fsdp"]), SiteConfig(name="b")]
    assert [p.config.distributed.strategy for p in resolve_sites(FederationConfig(sites=sites))] == ["fsdp", "ddp"]
    with pytest.raises(ConfigError) as refused:
        resolve_sites(FederationConfig(sites=sites, optimizer_state="kept"))
    assert refused.value.problems == [
        "sites[0] (a): optimizer_state: kept carries a torch optimizer's state between rounds, which "
        "distributed.strategy=fsdp does not save as one; use optimizer_state: fresh or distributed.strategy=ddp"
    ]


def _receipts_up_to_round_one_training(source: Path, target: Path, aggregation: dict) -> None:
    """A copy of a federation's directory as it stood after round 1's local training, with other aggregation
    settings and one round: round 1's training starts from the base model whatever the server optimizer,
    so the sites' checkpoints (copied with their runs) serve every optimizer."""
    copy_through_round_one_training(source, target, aggregation)


@pytest.mark.slow
def test_every_server_optimizer_makes_a_global_model_better_than_the_base(uninterrupted: Path, tmp_path: Path) -> None:
    """Round 1 of the federation again, averaged by each server optimizer with its default settings (in this
    process: the cost is one average and two evaluations per optimizer, not a start of torch each)."""
    from supertune.federation.run import federate

    for optimizer in ("fedadam", "fedyogi", "fedadagrad", "nesterov"):
        fed_dir = tmp_path / optimizer
        _receipts_up_to_round_one_training(uninterrupted, fed_dir, {"server_optimizer": optimizer, "server_lr": None,
                                                                   "server_momentum": None})  # fmt: skip
        federate(str(fed_dir), None)
        table = json.loads((fed_dir / "rounds.json").read_text())
        for row in table["rows"]:
            assert row["global"] < table["base"][row["site"]], (optimizer, row, table["base"])
        server = json.loads((fed_dir / "round-001" / "global" / "supertune-average.json").read_text())["server"]
        assert server["optimizer"] == optimizer and server["global_model"]["directory"] == str(
            fed_dir / "round-000" / "global")  # fmt: skip
        state = sorted(p.name for p in (fed_dir / "round-001" / "global").glob("server-*"))
        adaptive = optimizer != "nesterov"
        assert state == ["server-momentum.safetensors"] + (["server-second-moment.safetensors"] if adaptive else [])
        # the settings were used: the round's global model is not plain FedAvg's
        assert _max_difference(_global(fed_dir, 1), _global(uninterrupted, 1)) > 1e-4, optimizer


@pytest.mark.slow
def test_a_federation_saved_before_the_server_optimizer_keys_resumes_with_its_yaml(
    uninterrupted: Path, tmp_path: Path
) -> None:
    import shutil

    from supertune.errors import UserError
    from supertune.federation.run import federate

    fed_dir = tmp_path / "fed"
    shutil.copytree(uninterrupted, fed_dir, ignore=lambda d, names: {"run"} & set(names))
    saved = yaml.safe_load((fed_dir / "federation.yaml").read_text())
    assert saved["aggregation"]["server_lr"] == 1.0 and saved["aggregation"]["server_momentum"] == 0.0
    for key in ("server_optimizer", "server_beta2", "server_tau", "min_sites"):  # as written before these keys existed
        del saved["aggregation"][key]
    del saved["site_retries"]
    for site in saved["sites"]:
        del site["from_round"], site["until_round"]
    (fed_dir / "federation.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    federate(str(uninterrupted.parent / "federation.yaml"), str(fed_dir))  # the same settings: resumed, nothing to do
    with pytest.raises(UserError, match="holds a federation with other settings"):
        federate(str(_federation(tmp_path, aggregation={"server_optimizer": "fedadam"})), str(fed_dir))


@pytest.mark.slow
def test_a_federation_written_before_its_records_were_typed_resumes(uninterrupted: Path, tmp_path: Path) -> None:
    # Round 1 trained and decided as before: the training receipts of the oldest shape (no loss_tokens, no
    # seconds) and a cost.json with every kind of attempt, written as their writers wrote them. The resume
    # averages the round from them into the uninterrupted federation's global model and leaves them be.
    from supertune.federation.run import federate

    fed_dir = tmp_path / "fed"
    copy_before_average(uninterrupted, fed_dir, 1)
    attempts = [
        {"end": None, "job": None, "nodes": None, "outcome": "failed: submitting its job", "start": None, "submit": None},
        {"end": 1700003700.0, "job": None, "nodes": 1, "outcome": "finished", "processes": 1, "start": 1700000100.0,
         "submit": 1700000100.0},
    ]  # fmt: skip
    written = {}
    for site in ("site-a", "site-b"):
        receipt = fed_dir / "round-001" / site / "trained.json"
        oldest = {k: v for k, v in json.loads(receipt.read_text()).items() if k not in ("loss_tokens", "seconds")}
        receipt.write_text(json.dumps(oldest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        cost = receipt.with_name("cost.json")
        cost.write_text(json.dumps({"attempts": attempts}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written[receipt], written[cost] = receipt.read_bytes(), cost.read_bytes()
    federate(str(fed_dir), None)
    assert _max_difference(_global(fed_dir, 1), _global(uninterrupted, 1)) <= 1e-5
    assert {path: path.read_bytes() for path in written} == written
    rows = json.loads((fed_dir / "rounds.json").read_text())["rows"]
    assert [(r["site"], r["loss_tokens"], r["train_s"], r["attempts"]) for r in rows] == [
        ("site-a", None, 0.0, 2),
        ("site-b", None, 0.0, 2),
    ]
