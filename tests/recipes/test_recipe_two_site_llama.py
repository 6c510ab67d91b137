"""Replay of docs/tutorials/two-site-llama-federated.md: a Llama fine-tuned at two sites (Leonardo,
Karolina) on their own corpora, each site's documents templated "Write a document: {text}" with the
tokenizer read from its own path, trained in bf16 mixed precision under FSDP (Leonardo
`hybrid_zero2` on one node, Karolina `hybrid` across two), started with plain srun at each site,
then averaged from the sites' sharded checkpoints into a global model saved in fp16. CPU-scaled: one
round (a second starts the sites from the global model as the first did from the base: the local
federation tests run several), the embedded tiny Llama, both sites as jobs on the two-node Slurm test cluster with their
profiles adapted to it. A round's global model is also `supertune average` of the sites' gathered
final models, bit for bit: reading the shards a tensor at a time loses nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from replay import client_env, run_supertune, saved_config, site_on_test_cluster, write_yaml
from safetensors.torch import load_file

from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/two-site-llama-federated.md"


def test_a_round_of_two_fsdp_srun_sites_averaged_in_fp16(slurm_multi: SlurmCluster, tmp_path: Path, repo: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from supertune.averaging import average_checkpoints
    from supertune.embedded import default_tokenizer
    from supertune.federation.config.default import site_corpus

    tokenizer_dir = tmp_path / "llama-tokenizer"  # the recipe's separate tokenizer path
    AutoTokenizer.from_pretrained(default_tokenizer()).save_pretrained(tokenizer_dir)
    config_dir = tmp_path / "config"
    sites = []
    # (site, corpus, sharding, nodes): 2 processes a node; hybrid on two nodes is a 2 x 2 mesh
    for name, corpus, sharding, nodes in (
        ("leonardo", "site-a", "hybrid_zero2", 1),
        ("karolina", "site-b", "hybrid", 2),
    ):
        site_on_test_cluster(config_dir, name)
        train, validation = site_corpus(corpus)
        write_yaml(tmp_path / f"{name}.yaml", {
            "model": {"tokenizer": str(tokenizer_dir)},
            "data": {"train_files": str(train), "validation_files": str(validation), "template": "Write a document: {text}",
                     "block_size": 64, "max_eval_samples": 16},
            "training": {"per_device_train_batch_size": 4, "learning_rate": 2.0e-3, "bf16": True, "logging_steps": 2, "report_to": []},
            "generate": {"max_new_tokens": 0},
            "distributed": {"strategy": "fsdp", "fsdp": {"sharding": sharding}},
            "launch": {"launcher": "srun", "nodes": nodes, "procs_per_node": 2},
        })  # fmt: skip
        sites.append({"name": name, "config": f"{name}.yaml", "steps_per_round": 2, "where": name})
    federation = write_yaml(tmp_path / "federation.yaml", {
        "name": "llama-2sites", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "poll_seconds": 1,
        "aggregation": {"weights": "tokens", "dtype": "fp16"}, "sites": sites,
    })  # fmt: skip
    fed_dir = tmp_path / "fed"
    proc = run_supertune(
        "federate", str(federation), "--dir", str(fed_dir), env=client_env(slurm_multi.env, config_dir), cwd=tmp_path
    )
    log = proc.stderr
    meshes = {"leonardo": {"dp_shard": 2}, "karolina": {"dp_replicate": 2, "dp_shard": 2}}
    for name in ("leonardo", "karolina"):
        assert f"{name} round 1: submitted training job" in log, log[-3000:]
        trained = json.loads((fed_dir / "round-001" / name / "trained.json").read_text())
        run = Path(trained["run"])
        script = (run / "job.sbatch").read_text()
        assert "srun --kill-on-bad-exit=1 --ntasks-per-node=2" in script and "torch.distributed.run" not in script
        config = saved_config(run)
        assert (
            config["model"]["tokenizer"] == str(tokenizer_dir)
            and config["data"]["template"] == "Write a document: {text}"
        )
        summary = json.loads((run / "summary.json").read_text())
        assert summary["mixed_precision"] == "bf16" and summary["sharding"]["mesh"] == meshes[name], summary
        assert trained["step"] == 2  # each round a run of steps_per_round from the global model
        # what the round averaged: the site's sharded checkpoint, every rank's shards
        assert (Path(trained["checkpoint"]) / "fsdp_model").is_dir(), trained

    # round 1 averaged every rank's shards of both sites' checkpoints (no gathered weights in them):
    # the same model as `supertune average` of the two runs' gathered final models (their model/)
    round1 = fed_dir / "round-001"
    trained = [json.loads((round1 / name / "trained.json").read_text()) for name in ("leonardo", "karolina")]
    checkpoints = [t["checkpoint"] for t in trained]
    assert not [f for c in checkpoints for f in Path(c).glob("*.safetensors")], checkpoints
    manifest = json.loads((round1 / "global" / "supertune-average.json").read_text())
    assert [i["directory"] for i in manifest["inputs"]] == checkpoints
    assert {i["described"] for i in manifest["inputs"]} == {"checkpoint (FSDP shards)"}
    average_checkpoints([t["run"] for t in trained], tmp_path / "gathered", dtype="fp16")
    ours, theirs = (
        load_file(d / "model-00001-of-00001.safetensors") for d in (round1 / "global", tmp_path / "gathered")
    )
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    # the global model: fp16, loads with plain transformers, better on both sites' data than the base
    [global_dir] = [p for p in (fed_dir / "round-001").iterdir() if p.is_dir() and (p / "config.json").is_file()]
    weights = {k: v for f in global_dir.glob("*.safetensors") for k, v in load_file(f).items()}
    assert {t.dtype for t in weights.values()} == {torch.float16}
    assert json.loads((global_dir / "config.json").read_text())["dtype"] == "float16"
    assert {p.dtype for p in AutoModelForCausalLM.from_pretrained(global_dir).parameters()} == {torch.float16}
    table = json.loads((fed_dir / "rounds.json").read_text())
    assert sorted((row["round"], row["site"]) for row in table["rows"]) == [(1, "karolina"), (1, "leonardo")]
    for row in table["rows"]:
        assert row["global"] < table["base"][row["site"]], row
    text = (repo / TUTORIAL).read_text()
    assert "dtype: fp16" in text and "launcher: srun" in text and "tokenizer:" in text
