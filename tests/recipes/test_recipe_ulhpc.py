"""Replay of the ULHPC (Iris) recipe in docs/tutorials/meluxina-iris-deepspeed.md: OPT fine-tuned from a
local directory with full determinism, DeepSpeed ZeRO-3 with CPU offload over 2 processes started by
the deepspeed launcher, a fixed global batch of 16 (the same steps at 1 and 2 processes), evaluation
on the dataset's `test` split every epoch, `shuffle(seed=42).select(range(n))` samples, the model
saved (here in fp16, from ZeRO-3's gathered weights), reloaded with a plain transformers pipeline
and used to generate. CPU-scaled on the Slurm test cluster, with the Iris profile adapted to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from replay import (
    TINY,
    client_env,
    documents,
    losses,
    metrics,
    run_supertune,
    saved_config,
    site_on_test_cluster,
    submit_and_wait,
    summary,
    write_yaml,
)  # fmt: skip

from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/meluxina-iris-deepspeed.md"
ZERO_TOLERANCE = 1e-3  # ZeRO-3 with offload against itself at another process count: reduction order and CPU Adam


def _opt_model(directory: Path) -> Path:
    """A small OPT with its tokenizer in a local directory, as a downloaded model would be."""
    import torch
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    from supertune.embedded import default_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer())
    torch.manual_seed(0)
    # No dropout: its masks come from each process's random stream, so a batch split over 2 processes
    # would see other masks than the same batch accumulated in 1, and the losses could not be compared.
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=64, word_embed_proj_dim=64, ffn_dim=128, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=256, dropout=0.0, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    OPTForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _dataset(directory: Path) -> Path:
    """A dataset with train and test splits (no validation split), as the recipe's has."""
    directory.mkdir()
    for split, texts in (("train", documents(400)), ("test", documents(60, "validation"))):
        (directory / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8"
        )
    return directory


def test_opt_with_zero3_offload_at_a_fixed_global_batch(slurm_single: SlurmCluster, tmp_path: Path, repo: Path) -> None:
    run_yaml = write_yaml(tmp_path / "run.yaml", {
        "model": {"name_or_path": str(_opt_model(tmp_path / "opt-local"))},
        "data": {"dataset_name": str(_dataset(tmp_path / "dataset")), "validation_split": "test", "sample": "shuffled",
                 "max_train_samples": 12, "max_eval_samples": 8, "block_size": 64},
        "training": {"max_steps": -1, "num_train_epochs": 2, "global_batch_size": 16, "per_device_train_batch_size": 8,
                     "learning_rate": 1.0e-3, "full_determinism": True, "eval_strategy": "epoch", "save_strategy": "no"},
        "distributed": {"strategy": "zero3", "offload": "cpu"},
        "output": {"name": "opt-ulhpc", "dtype": "fp16"},
    })  # fmt: skip
    config_dir = tmp_path / "config"
    site_on_test_cluster(config_dir, "iris")
    env = client_env(slurm_single.env, config_dir)

    # 2 processes: a job of the deepspeed launcher on the test cluster (8 per process x 1 accumulation)
    two = tmp_path / "two"
    log = submit_and_wait(slurm_single, [str(run_yaml), "--cluster", "iris", "--nodes", "1", "--launcher", "deepspeed",
                                         "launch.procs_per_node=2", "training.fp16=false", *TINY], env, tmp_path, two)  # fmt: skip
    assert "--no_ssh" in (two / "job.sbatch").read_text() and "pdsh" not in log
    # 1 process here, the same config (8 per process x 2 accumulation)
    one = tmp_path / "one"
    run_supertune("train", str(run_yaml), "--run-dir", str(one), "--nproc", "1", *TINY, env=env, cwd=tmp_path)

    for run, per_device, accumulation, world in ((one, 8, 2, 1), (two, 8, 1, 2)):
        training = saved_config(run)["training"]
        assert (training["per_device_train_batch_size"], training["gradient_accumulation_steps"]) == (
            per_device,
            accumulation,
        )
        result = summary(run)
        assert (
            result["world_size"] == world
            and result["sharding"]["zero_stage"] == 3
            and result["sharding"]["offload"] == "cpu"
        )
    steps_one, steps_two = losses(one), losses(two)
    assert sorted(steps_one) == sorted(steps_two) and len(steps_one) >= 4
    worst = max(abs(steps_one[s] - steps_two[s]) for s in steps_one)
    assert worst <= ZERO_TOLERANCE, (worst, steps_one, steps_two)
    # evaluated on the test split at the end of each epoch
    assert [round(r["epoch"]) for r in metrics(two) if "eval_loss" in r] == [1, 2]
    assert "evaluating on the 'test' split" in log

    # the gathered ZeRO-3 model, in fp16, through a plain transformers pipeline
    assert json.loads((two / "model" / "config.json").read_text())["dtype"] == "float16"
    script = (
        "import json, sys, torch\n"
        "from transformers import pipeline\n"
        "generate = pipeline('text-generation', model=sys.argv[1])\n"
        "assert generate.model.dtype == torch.float16, generate.model.dtype\n"
        "out = generate('Once there was a town called', max_new_tokens=8, do_sample=False)\n"
        "print(json.dumps({'text': out[0]['generated_text'], 'modules': sorted(m for m in sys.modules if m.startswith('supertune'))}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(two / "model")], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    generated = json.loads(proc.stdout.strip().splitlines()[-1])
    assert generated["text"].startswith("Once there was a town called") and len(generated["text"]) > len(
        "Once there was a town called"
    )
    assert generated["modules"] == []
    assert "training.global_batch_size=16" in (repo / TUTORIAL).read_text()
