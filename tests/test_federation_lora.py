"""LoRA federations on this machine: two sites train adapters on the embedded default's frozen base;
with aggregation.lora: adapters only adapters move and the last global adapter is merged into the
base, with merged the global model is the average of the merged models; sites that cannot be
averaged together are refused in one line each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from federation_copies import copy_through_round_one_training, rehome_receipts
from supertune.federation.config.default import site_corpus

LORA_SITE = [
    "generate.max_new_tokens=0",
    "training.report_to=[]",
    "training.logging_steps=2",
    "training.warmup_steps=0",
    "training.learning_rate=5e-3",
    "data.max_eval_samples=16",
    "model.lora.enabled=true",
    "model.lora.r=4",
    "model.lora.dropout=0",
    "model.lora.target_modules=[all-linear]",
]


def _federation(tmp_path: Path, rounds: int, aggregation: dict | None = None, site_b: list[str] | None = None) -> Path:
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        extra = site_b if site_b is not None and name == "site-b" else []
        sites.append({"name": name, "steps_per_round": 3,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *LORA_SITE, *extra]})  # fmt: skip
    config = {"name": "fed-lora", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": rounds,
              "aggregation": aggregation or {}, "sites": sites}  # fmt: skip
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _weights(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(directory.glob("*.safetensors")):
        if not f.name.startswith("server-"):
            out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sites x two rounds with aggregation.lora: adapters (the default), in this process: round 1
    continues the federation's initial adapter, round 2 the global adapter of round 1."""
    from supertune.federation.run import federate

    root = tmp_path_factory.mktemp("lora")
    fed_dir = root / "fed"
    federate(str(_federation(root, rounds=2)), str(fed_dir))
    return fed_dir


@pytest.mark.slow
def test_a_global_adapter_improves_every_site_over_the_base_and_only_adapters_move(adapters: Path) -> None:
    fed_dir = adapters
    table = json.loads((fed_dir / "rounds.json").read_text())
    assert [(r["round"], r["site"]) for r in table["rows"]] == [(n, s) for n in (1, 2) for s in ("site-a", "site-b")]
    for row in table["rows"]:
        assert row["global"] < table["base"][row["site"]], (row, table["base"])
    base = _weights(fed_dir / "round-000" / "global")
    for number in (1, 2):
        rd = fed_dir / f"round-{number:03d}"
        adapter = _weights(rd / "global")
        assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)  # the global model is an adapter
        assert sorted(p.name for p in (rd / "global").glob("*.safetensors")) == ["adapter_model.safetensors"]
        receipt = json.loads((rd / "averaged.json").read_text())
        size = (rd / "global" / "adapter_model.safetensors").stat().st_size
        assert receipt["received_bytes"] == size and set(receipt["sent_bytes"].values()) == {size}
        assert all(r["sent_bytes"] == size for r in table["rows"] if r["round"] == number)
        assert size * 10 < sum(v.nbytes for v in base.values())  # an adapter is a small part of the model
        # every site continued the previous global adapter on the frozen base
        site = yaml.safe_load((rd / "site-a" / "site.yaml").read_text())
        start = fed_dir / ("round-000/adapter" if number == 1 else f"round-{number - 1:03d}/global")
        assert site["model"]["name_or_path"] == str(start)
    # the global adapter is the token-weighted mean of the sites' adapter tensors (not of merged models)
    rd = fed_dir / "round-002"
    weights = json.loads((rd / "averaged.json").read_text())["weights"]
    trained = {s: _weights(Path(json.loads((rd / s / "trained.json").read_text())["checkpoint"])) for s in weights}
    for name, value in _weights(rd / "global").items():
        expected = sum(weights[s] * trained[s][name].astype(np.float64) for s in weights)
        assert np.max(np.abs(value - expected)) < 1e-6, name
    # the final merged model: base + s * B @ A for every adapted layer, a plain model with the base's tensors
    merged = _weights(fed_dir / "merged")
    assert merged.keys() == base.keys()
    adapter = _weights(rd / "global")
    config = json.loads((rd / "global" / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    changed = 0
    for key, value in merged.items():
        module = "base_model.model." + key.removesuffix(".weight")
        a, b = adapter.get(f"{module}.lora_A.weight"), adapter.get(f"{module}.lora_B.weight")
        expected = base[key].astype(np.float64) + (scale * b.astype(np.float64) @ a if a is not None else 0)
        assert np.max(np.abs(value - expected)) < 1e-5, key
        changed += a is not None
    assert changed == 7  # q, k, v, o, gate, up, down of the one layer
    # by hand: supertune average merges one adapter into its base, to the same tensors
    from supertune.cli.main import main

    by_hand = fed_dir.parent / "merged-by-hand"
    argv = [str(rd / "global"), "--out", str(by_hand), "--merge-first", "--base", str(fed_dir / "round-000" / "global")]
    assert main(["average", *argv]) == 0
    merged_by_hand = _weights(by_hand)
    assert merged_by_hand.keys() == merged.keys() and all(
        np.array_equal(v, merged[k]) for k, v in merged_by_hand.items()
    )


def _after_round_one_training(source: Path, target: Path, aggregation: dict) -> None:
    """A copy of the federation as it stood after round 1's local training, with other aggregation settings
    and one round. Round 1 trains a new adapter on the base in both modes (adapters: from the federation's
    initial adapter, whose B is zero), so the sites' checkpoints (copied with their runs) serve each setting."""
    copy_through_round_one_training(source, target, aggregation, leave_out=("merged",))


@pytest.mark.slow
def test_merged_lora_averages_the_merged_models(adapters: Path, tmp_path: Path) -> None:
    """Round 1 averaged as merged models: base + sum_i w_i s B_i A_i, a full model every site is better under."""
    from supertune.federation.run import federate

    fed_dir = tmp_path / "merged"
    _after_round_one_training(adapters, fed_dir, {"lora": "merged"})
    federate(str(fed_dir), None)
    table = json.loads((fed_dir / "rounds.json").read_text())
    for row in table["rows"]:
        assert row["global"] < table["base"][row["site"]], (row, table["base"])
    base = _weights(fed_dir / "round-000" / "global")
    rd = fed_dir / "round-001"
    merged = _weights(rd / "global")
    assert merged.keys() == base.keys() and not (fed_dir / "merged").exists()
    receipt = json.loads((rd / "averaged.json").read_text())
    assert max(receipt["sent_bytes"].values()) * 10 < receipt["received_bytes"]  # adapters up, the full model down
    weights = receipt["weights"]
    trained = {s: Path(json.loads((rd / s / "trained.json").read_text())["checkpoint"]) for s in weights}
    config = json.loads((trained["site-a"] / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    adapters_of = {s: _weights(p) for s, p in trained.items()}
    key = "model.layers.0.self_attn.q_proj.weight"
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    delta = sum(
        weights[s]
        * scale
        * adapters_of[s][f"{module}.lora_B.weight"].astype(np.float64)
        @ adapters_of[s][f"{module}.lora_A.weight"]
        for s in weights
    )
    assert np.max(np.abs(delta)) > 1e-4  # the sites did train
    assert np.max(np.abs(merged[key] - (base[key] + delta))) < 1e-5
    # not what averaging the adapters gives: the product of the averages
    mean = {n: sum(weights[s] * adapters_of[s][n].astype(np.float64) for s in weights) for n in adapters_of["site-a"]}
    product = scale * mean[f"{module}.lora_B.weight"] @ mean[f"{module}.lora_A.weight"]
    assert np.max(np.abs(product - delta)) > 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["adapters", "merged"])
def test_a_server_optimizer_steps_what_is_averaged(lora: str, adapters: Path, tmp_path: Path) -> None:
    """fedadam on the adapter tensors (its state the adapter's shape) or on the merged model's (the full model's)."""
    from supertune.federation.run import federate

    fed_dir = tmp_path / lora
    _after_round_one_training(adapters, fed_dir, {"lora": lora, "server_optimizer": "fedadam", "server_lr": None,
                                                  "server_momentum": None})  # fmt: skip
    federate(str(fed_dir), None)
    table = json.loads((fed_dir / "rounds.json").read_text())
    for row in table["rows"]:
        assert row["global"] < table["base"][row["site"]], (lora, row, table["base"])
    out = fed_dir / "round-001" / "global"
    state = load_file(out / "server-momentum.safetensors")
    assert state.keys() == _weights(out).keys()
    assert all(v.dtype == np.float32 for v in state.values())


def test_sites_that_cannot_be_averaged_together_are_refused_in_one_line_each(tmp_path: Path) -> None:
    from supertune.config.errors import ConfigError
    from supertune.federation.config.load import load_federation
    from supertune.federation.config.sites import resolve_sites

    def problems(
        site_b: list[str], aggregation: dict | None = None, every: list[str] | None = None, **extra
    ) -> list[str]:
        path = _federation(tmp_path, rounds=1, aggregation=aggregation, site_b=site_b)
        data = yaml.safe_load(path.read_text())
        data.update(extra)
        for site in data["sites"]:
            site["overrides"] += every or []
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        fed, _ = load_federation(str(path))
        with pytest.raises(ConfigError) as caught:
            resolve_sites(fed)
        return caught.value.problems

    assert problems(["model.lora.enabled=false"]) == [
        "model.lora.enabled: sites site-a train LoRA adapters and site-b the whole model; adapters and full models "
        "cannot be averaged together, set model.lora.enabled the same at every site"
    ]
    got = problems(["model.lora.r=8", "model.lora.target_modules=[q_proj]"])
    assert len(got) == 2 and got[0].startswith("sites[1] (site-b): model.lora.r=8 but site site-a has 4;")
    assert got[1].startswith(
        "sites[1] (site-b): model.lora.target_modules=['q_proj'] but site site-a has ['all-linear'];"
    )
    assert all("\n" not in p for p in got)
    assert problems([], aggregation={"lora": "merged"}, every=["model.lora.enabled=false"])[0].startswith(
        "aggregation.lora: merged averages LoRA adapters as merged models, and no site trains adapters;"
    )
    assert problems([], aggregation={"lora": "merged"}, optimizer_state="kept")[0].startswith(
        "optimizer_state: kept carries a site's AdamW moments into the next round, and with aggregation.lora: merged"
    )


@pytest.mark.slow
def test_a_site_killed_while_continuing_the_global_adapter_resumes_to_the_same_adapter(
    adapters: Path, tmp_path: Path
) -> None:
    """Site-a's round 2 again (site-b's kept), with a checkpoint every step, killed (SIGKILL) after its first:
    the resumed run continues the global adapter from its checkpoint, and the round reaches the uninterrupted
    round 2's global adapter."""
    import shutil
    import subprocess
    import sys

    fed_dir = tmp_path / "fed"

    def keep(directory: str, names: list[str]) -> set[str]:
        here = Path(directory)
        if here == adapters:
            return {"merged", "rounds.json", "rounds.md", "rounds.png"} & set(names)
        if here == adapters / "round-002":  # site-b's training of round 2 is kept: only site-a trains again
            return {"site-a", "global", "averaged.json"} & set(names)
        return {"evaluated.json"} & set(names) if here == adapters / "round-002" / "site-b" else set()

    shutil.copytree(adapters, fed_dir, ignore=keep)
    rehome_receipts(adapters, fed_dir)
    config = yaml.safe_load((fed_dir / "federation.yaml").read_text())
    config["rounds"] = 2
    for site in config["sites"]:  # checkpoints do not change what is trained
        site["overrides"].append("training.save_steps=1")
    (fed_dir / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    killed = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(fed_dir)],
        capture_output=True,
        text=True,
        env=dict(os.environ, SUPERTUNE_FAULT="step@2"),
        timeout=600,
    )
    assert killed.returncode != 0
    run = fed_dir / "round-002" / "site-a" / "run"
    assert not (fed_dir / "round-002" / "site-a" / "trained.json").exists() and any(run.rglob("checkpoint-1"))
    from supertune.federation.run import federate

    federate(str(fed_dir), None)
    ours, theirs = _weights(fed_dir / "round-002" / "global"), _weights(adapters / "round-002" / "global")
    assert ours.keys() == theirs.keys()
    assert max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours) <= 1e-6
    assert (fed_dir / "merged").is_dir()


def test_a_global_adapter_is_refused_for_a_site_reached_over_ssh() -> None:
    from supertune.config.errors import ConfigError
    from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig
    from supertune.federation.config.sites import resolve_sites

    def fed(lora: str) -> FederationConfig:
        lora_on = ["model.lora.enabled=true", "generate.max_new_tokens=0"]
        remote = ["data.train_files=/site/scratch/corpus/*.jsonl", "data.validation_files=/site/scratch/valid.jsonl"]
        return FederationConfig(executor="streamflow", aggregation=AggregationConfig(lora=lora), sites=[  # type: ignore[arg-type]
            SiteConfig(name="far", login="me@login.example.org", workdir="/site/work", overrides=[*remote, *lora_on]),
            SiteConfig(name="near", overrides=lora_on),
        ])  # fmt: skip

    assert len(resolve_sites(fed("merged"))) == 2  # the full model goes to the site
    with pytest.raises(ConfigError) as refused:
        resolve_sites(fed("adapters"))
    assert refused.value.problems == [
        "aggregation.lora: adapters: the global adapter names its base by its path on this machine, which sites far "
        "(reached over SSH) do not have; use aggregation.lora: merged, which sends them the full model"
    ]


@pytest.mark.slow
def test_site_agents_send_their_adapters_and_the_coordinator_averages_the_merged_models(tmp_path: Path) -> None:
    """executor: agents with LoRA sites (aggregation.lora: merged): each agent trains an adapter on the
    full global model it got, puts only the adapter on the exchange, and the coordinator's global model is
    base + sum_i w_i s B_i A_i of what the agents sent; every site is better under it than under the base.
    aggregation.lora: adapters is refused in one line, at the coordinator and at an agent."""
    import subprocess
    import sys

    path = _federation(tmp_path, rounds=1, aggregation={"lora": "merged"})
    data = yaml.safe_load(path.read_text())
    exchange = tmp_path / "exchange"
    data.update(executor="agents", exchange=str(exchange), poll_seconds=1)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    def start(*args: str, log: str) -> subprocess.Popen:
        out = (tmp_path / log).open("w")
        return subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)  # fmt: skip

    procs = {
        "coordinator.log": start(str(path), "--dir", str(tmp_path / "fed"), log="coordinator.log"),
        **{
            f"{s}.log": start("--site", s, str(exchange), "--dir", str(tmp_path / s), log=f"{s}.log")
            for s in ("site-a", "site-b")
        },  # fmt: skip
    }
    try:
        import time

        deadline = time.time() + 600
        while any(proc.poll() is None for proc in procs.values()) and time.time() < deadline:
            for log, proc in procs.items():  # an agent that stopped with an error leaves the coordinator waiting
                assert proc.poll() in (None, 0), (tmp_path / log).read_text()[-3000:]
            time.sleep(0.5)
        for log, proc in procs.items():
            assert proc.poll() == 0, (tmp_path / log).read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    fed_dir = tmp_path / "fed"
    table = json.loads((fed_dir / "rounds.json").read_text())
    for row in table["rows"]:
        assert row["global"] < table["base"][row["site"]], (row, table["base"])
    rd = fed_dir / "round-001"
    receipt = json.loads((rd / "averaged.json").read_text())
    assert max(receipt["sent_bytes"].values()) * 10 < receipt["received_bytes"]  # adapters up, the full model down
    base, merged = _weights(fed_dir / "round-000" / "global"), _weights(rd / "global")
    assert merged.keys() == base.keys()
    weights = receipt["weights"]
    sent = {s: rd / s / "sent" for s in weights}  # what each agent put on the exchange, as the coordinator got it
    # a package of the adapter's 14 tensors as trained (no transfer settings: their own dtype, stored flat)
    from supertune.transfer import PACKAGE_MANIFEST

    got = {}
    for s, d in sent.items():
        shapes = {n: t["shape"] for n, t in json.loads((d / PACKAGE_MANIFEST).read_text())["tensors"].items()}
        got[s] = {n: v.reshape(shapes[n]) for n, v in _weights(d).items()}
    assert all(len(g) == 14 and all(".lora_A." in k or ".lora_B." in k for k in g) for g in got.values())
    config = json.loads((sent["site-a"] / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    changed = 0
    for key in base:
        module = "base_model.model." + key.removesuffix(".weight")
        if f"{module}.lora_A.weight" not in got["site-a"]:
            assert np.array_equal(merged[key], base[key]), key
            continue
        delta = sum(
            weights[s]
            * scale
            * got[s][f"{module}.lora_B.weight"].astype(np.float64)
            @ got[s][f"{module}.lora_A.weight"]
            for s in weights
        )
        assert np.max(np.abs(merged[key] - (base[key] + delta))) < 1e-5, key
        changed += 1
    assert changed == 7
    # the coordinator never trained: the agents did, each in its own directory
    assert not list(fed_dir.glob("round-*/*/run")) and list((tmp_path / "site-a").glob("round-001/site-a/run"))

    from supertune.config.errors import ConfigError
    from supertune.federation.config.load import load_federation
    from supertune.federation.config.sites import resolve_sites

    data["aggregation"] = {"lora": "adapters"}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    fed, _ = load_federation(str(path))
    with pytest.raises(ConfigError) as refused:
        resolve_sites(fed)
    assert refused.value.problems == [
        "aggregation.lora: adapters: the global adapter names its base by its path on the coordinator, which the "
        "sites' agents do not have; use aggregation.lora: merged, which sends them the full model"
    ]
