"""Replay of docs/tutorials/ibex-accelerate-multinode.md: KAUST Ibex's multi-node Hugging Face recipe
(one `accelerate launch` per node with a static rendezvous: --num_machines, --num_processes over all
nodes, --machine_rank of each node, the first node's address and port), checkpointing every epoch,
CPU-scaled on the two emulated nodes of the Slurm test cluster with the Ibex profile adapted to them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from replay import TINY, client_env, metrics, site_on_test_cluster, submit_and_wait, summary, write_yaml

from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/ibex-accelerate-multinode.md"


def test_accelerate_on_two_nodes_with_a_checkpoint_per_epoch(
    slurm_multi: SlurmCluster, tmp_path: Path, jsonl_files: tuple[Path, Path], repo: Path
) -> None:
    train, validation = jsonl_files
    run_yaml = write_yaml(tmp_path / "run.yaml", {
        "model": {"config_overrides": {"num_hidden_layers": 1}},
        "data": {"train_files": str(train), "validation_files": str(validation), "block_size": 64, "max_train_samples": 30},
        "training": {"max_steps": -1, "num_train_epochs": 2, "per_device_train_batch_size": 8, "save_strategy": "epoch",
                     "eval_strategy": "epoch"},
        "output": {"name": "ibex-epochs"},
    })  # fmt: skip
    config_dir = tmp_path / "config"
    site_on_test_cluster(config_dir, "ibex")
    run_dir = tmp_path / "run"
    args = [str(run_yaml), "--cluster", "ibex", "--nodes", "2", "--launcher", "accelerate", "launch.procs_per_node=1",
            "training.fp16=false", *TINY]  # fmt: skip
    log = submit_and_wait(slurm_multi, args, client_env(slurm_multi.env, config_dir), tmp_path, run_dir)

    # one accelerate launch per node, each with its own machine rank, all with the first node's address
    accelerate = yaml.safe_load((run_dir / "accelerate_config.yaml").read_text())
    assert (accelerate["rdzv_backend"], accelerate["num_machines"], accelerate["num_processes"]) == ("static", 2, 2)
    step = next(line for line in (run_dir / "job.sbatch").read_text().splitlines() if line.startswith("srun "))
    assert (
        '--machine_rank "${SLURM_NODEID}" --main_process_ip "${MASTER_ADDR}" --main_process_port "${MASTER_PORT}"'
        in step
    )
    # (accelerate launch starts its processes through torch's elastic agent, which is what they report)
    assert sorted(re.findall(r"supertune: rank (\d) of 2 on (node\d) ", log)) == [("0", "node1"), ("1", "node2")]

    # a checkpoint at the end of each epoch, each evaluated
    result = summary(run_dir)
    steps = result["train_steps"]
    assert steps % 2 == 0 and steps >= 4
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in checkpoints] == [f"checkpoint-{steps // 2}", f"checkpoint-{steps}"]
    epochs = [json.loads((p / "trainer_state.json").read_text())["epoch"] for p in checkpoints]
    assert epochs == [1.0, 2.0]
    assert [round(r["epoch"]) for r in metrics(run_dir) if "eval_loss" in r] == [1, 2]
    assert result["world_size"] == 2 and result["mixed_precision"] == "no"
    assert "--nodes 2 --launcher accelerate" in (repo / TUTORIAL).read_text()
