"""`supertune sweep --cluster local --gpus 1,2 --wait` on the two emulated nodes of the Slurm test
cluster: one job on one node, one on two (CPU: one process per node), then `supertune report`."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.slurm_cluster import SlurmCluster
from slurm_fixtures import supertune

QUICK = [
    "training.max_steps=8", "training.logging_steps=2", "training.save_strategy=no", "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1", "data.max_eval_samples=32", "training.report_to=[]",
    "output.save_model=false", "training.per_device_train_batch_size=8", "slurm.time=00:10:00",
]  # fmt: skip


def test_a_sweep_over_one_and_two_nodes(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    from supertune.embedded.corpus import default_corpus
    from supertune.embedded.tokenizer import default_tokenizer

    default_corpus()  # the jobs find the cached corpus and tokenizer instead of both building them
    default_tokenizer()
    config_dir = tmp_path / "config"
    (config_dir / "clusters").mkdir(parents=True)
    # The emulated nodes share this machine's cores: one thread per process, one process per node.
    (config_dir / "clusters" / "local.yaml").write_text('env:\n  OMP_NUM_THREADS: "1"\n', encoding="utf-8")
    env = dict(slurm_multi.env, SUPERTUNE_CONFIG_DIR=str(config_dir))
    sweep_dir = tmp_path / "sweep"

    proc = supertune("sweep", "--cluster", "local", "--gpus", "1,2", "--wait", "--sweep-dir", str(sweep_dir), *QUICK,
                     env=env, cwd=tmp_path, timeout=900)  # fmt: skip
    logs = "".join(p.read_text(errors="replace") for p in sorted(sweep_dir.glob("devices-*/logs/*")))
    assert proc.returncode == 0, proc.stderr[-3000:] + logs[-4000:]

    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    assert [(r["devices"], r["nodes"], r["per_node"], r["state"]) for r in runs] == [
        (1, 1, 1, "finished"),
        (2, 2, 1, "finished"),
    ]
    assert all(r["job_id"] for r in runs)
    one, two = (json.loads((sweep_dir / f"devices-{n}" / "summary.json").read_text()) for n in (1, 2))
    assert (one["world_size"], one["nodes"], two["world_size"], two["nodes"]) == (1, 1, 2, 2)
    assert one["train_tokens"] == two["train_tokens"] == 8 * 8 * 128  # the same global batch of 8 sequences
    assert abs(one["eval_loss"] - two["eval_loss"]) <= 1e-4
    two_log = "".join(p.read_text(errors="replace") for p in sorted((sweep_dir / "devices-2" / "logs").iterdir()))
    assert "devices 2 x CPU on 2 nodes" in two_log and "rank 1 of 2 on node2" in two_log

    report = supertune("report", str(sweep_dir), env=env, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = [line.strip("|").split("|") for line in report.stdout.splitlines() if line.startswith("| ")][2:]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 1), (2, 2)]
    speedup = two["throughput_tokens_per_s"] / one["throughput_tokens_per_s"]
    assert rows[1][4].strip() == f"{speedup:.2f}x" and rows[1][3].strip() == f"{two['throughput_tokens_per_s']:,.0f}"
    assert sorted(p.name for p in (sweep_dir / "report").glob("*.png")) == [
        "loss.png",
        "speedup.png",
        "tokens_per_device.png",
    ]
