"""Replay of docs/tutorials/twcc-srun-torchrun.md: TWCC's run_clm recipe (srun + one torchrun per
node with the c10d rendezvous, plain text train/validation files, GPT-2 built from its config with
n_embd/n_layer overrides, DeepSpeed ZeRO-2 from the recipe's own JSON), CPU-scaled on the two
emulated nodes of the Slurm test cluster.

The ZeRO-2 file is the recipe's shape ("auto" where the Trainer knows the value, its own bucket
sizes): supertune keeps it as the base, fills what must agree with the run, and the run directory
holds the merged file DeepSpeed ran with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from replay import TINY, client_env, losses, saved_config, site_on_test_cluster, submit_and_wait, summary, write_yaml

from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/twcc-srun-torchrun.md"

ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}  # fmt: skip


def test_gpt2_from_config_with_a_zero2_file_over_srun_and_torchrun(
    slurm_multi: SlurmCluster, tmp_path: Path, text_files: tuple[Path, Path], repo: Path
) -> None:
    from transformers import GPT2Config

    train, validation = text_files
    GPT2Config().save_pretrained(tmp_path / "gpt2")  # the recipe's --model_type gpt2: GPT-2's own config
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ds_zero2.json").write_text(json.dumps(ZERO2, indent=2))
    run_yaml = write_yaml(tmp_path / "run.yaml", {
        "model": {"name_or_path": str(tmp_path / "gpt2"), "from_config": True,
                  "config_overrides": "n_embd=64,n_layer=2,n_head=2", "tokenizer": "train", "tokenizer_vocab_size": 2000},
        "data": {"train_files": str(train), "validation_files": str(validation), "block_size": 64},
        "training": {"max_steps": 4, "per_device_train_batch_size": 4, "learning_rate": 1.0e-3},
        "distributed": {"strategy": "zero2", "deepspeed_config": "configs/ds_zero2.json"},
        "output": {"name": "gpt2-twcc"},
    })  # fmt: skip
    config_dir = tmp_path / "config"
    site_on_test_cluster(config_dir, "twcc")
    run_dir = tmp_path / "run"
    args = [str(run_yaml), "--cluster", "twcc", "--nodes", "2", "--launcher", "torchrun", "launch.procs_per_node=1",
            "training.fp16=false", "training.save_strategy=no", *TINY]  # fmt: skip
    log = submit_and_wait(slurm_multi, args, client_env(slurm_multi.env, config_dir), tmp_path, run_dir)

    # srun starts one torchrun per node, which meet at the c10d rendezvous on the first node
    script = (run_dir / "job.sbatch").read_text()
    assert (
        ' -m torch.distributed.run "--nnodes=${SLURM_JOB_NUM_NODES}" --nproc-per-node=1 "--rdzv-id=${SLURM_JOB_ID}" --rdzv-backend=c10d '
        '"--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}" -m supertune.entry train-worker' in script
    )
    assert sorted(re.findall(r"supertune: rank (\d) of 2 on (node\d)", log)) == [("0", "node1"), ("1", "node2")]
    # GPT-2 from its config, with the recipe's overrides
    model_config = json.loads((run_dir / "model" / "config.json").read_text())
    assert (model_config["model_type"], model_config["n_embd"], model_config["n_layer"]) == ("gpt2", 64, 2)
    # the recipe's ZeRO-2 file, merged: its own settings kept, batch and precision left to the Trainer
    merged = json.loads((run_dir / "deepspeed_config.json").read_text())
    assert merged["zero_optimization"]["allgather_bucket_size"] == 2e8 and merged["fp16"]["initial_scale_power"] == 16
    assert merged["train_micro_batch_size_per_gpu"] == "auto" and "train_batch_size" not in merged
    assert saved_config(run_dir)["distributed"]["deepspeed_config"] == str(tmp_path / "configs" / "ds_zero2.json")
    result = summary(run_dir)
    assert result["sharding"]["zero_stage"] == 2 and result["world_size"] == 2 and result["mixed_precision"] == "no"
    assert sorted(losses(run_dir)) == [1, 2, 3, 4]
    assert "distributed.deepspeed_config=" in (repo / TUTORIAL).read_text()
