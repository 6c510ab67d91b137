"""Every launcher through real `supertune submit --cluster local` on the Slurm test clusters: 2 nodes
x 1 process each, and 1 node x 2 processes for the launchers whose one-node start differs from their
two-node one (accelerate, deepspeed), each a DDP run of the tiny default model whose per-step losses
and final eval loss must equal a local `supertune train --nproc 2` run's at the same global batch.
torchrun and srun on one node with two processes are the jobs of tests/test_slurm_strategies.py and
of the two-site recipe's Leonardo site (tests/recipes/test_recipe_two_site_llama.py).

FSDP's hybrid sharding runs on the two nodes (2 x 2 processes) under torchrun against a local
4-process run (under srun: the recipe's Karolina site). All eight jobs are submitted at once (each
cluster runs its own queue, one job at a time on its 2 CPUs) and shared by the tests below through
one module-scoped fixture.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.slurm_cluster import SlurmCluster
from slurm_fixtures import supertune

LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "srun")
TOPOLOGIES = {"1x2": (1, 2), "2x1": (2, 1)}  # nodes x processes per node: world size 2 either way
# One node, two processes under torchrun and srun: jobs of other test files (the module docstring).
COVERED_ELSEWHERE = {("torchrun", "1x2"), ("srun", "1x2")}
# The smallest run that still proves it: one decoder layer, 8 logged steps, a short evaluation.
# Global batch 2 x 8 = 16 sequences everywhere.
COMMON = [
    "training.max_steps=8",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1",
    "training.per_device_train_batch_size=8",
    "data.max_eval_samples=64",
]
# FSDP hybrid across the two nodes (2 x 2 processes: shards within a node, replicas across), under
# the two launchers that start a job's processes differently (one agent per node, or srun tasks).
# 2 sequences a forward pass x 2 micro-batches x 4 processes keep the global batch at 16, so the
# gradient reduction across the nodes waits for the last micro-batch; the reference is a local
# 4-process DDP run at the same split, since 4 ranks draw other sequences into a step than 2 do
# (step 1 differed by 2e-3 from 2 x 8).
HYBRID_SPLIT = ["training.per_device_train_batch_size=2", "training.global_batch_size=16"]
HYBRID = {
    f"fsdp-hybrid-{launcher}-2x2": [
        "--launcher",
        launcher,
        "launch.procs_per_node=2",
        "distributed.strategy=fsdp",
        "distributed.fsdp.sharding=hybrid",
        *HYBRID_SPLIT,
    ]
    for launcher in ("torchrun",)
}
TOLERANCE = 1e-4  # DDP: same data, same seeds, only the reduction order may differ
FSDP_TOLERANCE = 1e-5  # fp32 FSDP against DDP at the same split, as tests/test_fsdp.py holds every mode
JOB_TIMEOUT = 420.0


@dataclass
class Run:
    """One finished run: where it is, its per-step losses and summary, and (for a job) its log."""

    run_dir: Path
    losses: dict[int, float]
    summary: dict[str, object]
    job_id: int | None = None
    state: str = ""
    log: str = ""
    seconds: float = 0.0


def _client_env(cluster: SlurmCluster | None, config_dir: Path) -> dict[str, str]:
    env = dict(cluster.env if cluster else os.environ)
    env["SUPERTUNE_CONFIG_DIR"] = str(config_dir)  # the shipped local profile, not the tester's own
    return env


def _results(run_dir: Path) -> tuple[dict[int, float], dict[str, object]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}
    return losses, json.loads((run_dir / "summary.json").read_text())


def _job_log(run_dir: Path, job_id: int) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob(f"*-{job_id}.*")))


@pytest.fixture(scope="module")
def runs(
    slurm_single: SlurmCluster, slurm_multi: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Run]:
    """Keys: "local", and "<launcher>-1x2" / "<launcher>-2x1" for the jobs."""
    from supertune.embedded.corpus import default_corpus
    from supertune.embedded.tokenizer import default_tokenizer

    root = tmp_path_factory.mktemp("launchers")
    config_dir = root / "config"
    # A user profile over the shipped one, the way a site would adapt it. The two emulated nodes
    # share this machine's cores: with a thread per core each, their processes spin against each
    # other (8 steps took 3 to 18 s instead of 0.7 s).
    (config_dir / "clusters").mkdir(parents=True)
    (config_dir / "clusters" / "local.yaml").write_text('env:\n  OMP_NUM_THREADS: "1"\n', encoding="utf-8")
    # Build the cached corpus and tokenizer once, before eight jobs would all build them at once.
    default_corpus()
    default_tokenizer()

    # key -> (cluster, nodes, the job's own arguments)
    jobs: dict[str, tuple[SlurmCluster, int, list[str]]] = {
        f"{launcher}-{topology}": (
            slurm_single if nodes == 1 else slurm_multi,
            nodes,
            ["--launcher", launcher, f"launch.procs_per_node={procs}"],
        )
        for topology, (nodes, procs) in TOPOLOGIES.items()
        for launcher in LAUNCHERS
        if (launcher, topology) not in COVERED_ELSEWHERE
    }
    jobs.update({key: (slurm_multi, 2, args) for key, args in HYBRID.items()})
    submitted: dict[str, tuple[SlurmCluster, int, Path, float]] = {}
    for key, (cluster, nodes, args) in jobs.items():
        run_dir = root / key
        proc = supertune(
            "submit",
            "--cluster",
            "local",
            "--nodes",
            str(nodes),
            "--run-dir",
            str(run_dir),
            *COMMON,
            *args,
            env=_client_env(cluster, config_dir),
            cwd=root,
        )
        assert proc.returncode == 0, proc.stderr
        submitted[key] = (cluster, int(proc.stdout.strip()), run_dir, time.monotonic())

    out: dict[str, Run] = {}
    for name, nproc, extra in (("local", 2, []), ("local-4", 4, HYBRID_SPLIT)):
        local_dir = root / name
        local = supertune(
            "train",
            "--nproc",
            str(nproc),
            "--run-dir",
            str(local_dir),
            *COMMON,
            *extra,
            env=_client_env(None, config_dir),
            cwd=root,
            timeout=600,
        )
        assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
        out[name] = Run(local_dir, *_results(local_dir))

    for key, (cluster, job_id, run_dir, _) in submitted.items():
        state = cluster.wait(job_id, timeout=JOB_TIMEOUT)
        log = _job_log(run_dir, job_id)
        assert state == "COMPLETED", f"{key}: job {job_id} {state}\n{log[-4000:]}"
        info = cluster.job_info(job_id)
        seconds = _run_seconds(info.get("RunTime", "0"))
        out[key] = Run(run_dir, *_results(run_dir), job_id=job_id, state=state, log=log, seconds=seconds)
    print("\njob run times:", ", ".join(f"{k} {r.seconds:.0f} s" for k, r in out.items() if r.job_id))
    return out


def _run_seconds(runtime: str) -> float:
    """Slurm's RunTime ([D-]HH:MM:SS) in seconds."""
    days, _, clock = runtime.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


JOBS = [
    f"{launcher}-{topology}"
    for topology in TOPOLOGIES
    for launcher in LAUNCHERS
    if (launcher, topology) not in COVERED_ELSEWHERE
]


@pytest.mark.parametrize("key", JOBS)
def test_job_completes_with_two_processes_where_asked(
    key: str, runs: dict[str, Run], slurm_single: SlurmCluster
) -> None:
    run = runs[key]
    assert run.summary["world_size"] == 2 and run.summary["train_steps"] == 8
    # Each process says where it runs: both ranks, each once, on the right hosts.
    places = re.findall(r"supertune: rank (\d) of (\d) on (\S+) \(node (\d) of (\d)", run.log)
    assert sorted(p[0] for p in places) == ["0", "1"], run.log[-3000:]
    assert {p[1] for p in places} == {"2"}
    hosts = sorted(p[2] for p in places)
    if key.endswith("2x1"):
        assert hosts == ["node1", "node2"]
        assert sorted((p[3], p[4]) for p in places) == [("0", "2"), ("1", "2")]
    else:
        assert hosts == [slurm_single.nodes[0]] * 2
    assert f"supertune: job {run.job_id} on " in run.log
    assert "Traceback" not in run.log, run.log[-4000:]


@pytest.mark.parametrize("key", JOBS)
def test_losses_equal_the_local_run(key: str, runs: dict[str, Run]) -> None:
    local, run = runs["local"], runs[key]
    assert local.summary["world_size"] == 2
    assert sorted(run.losses) == sorted(local.losses) == list(range(1, 9))
    worst = max(abs(run.losses[s] - local.losses[s]) for s in local.losses)
    assert worst <= TOLERANCE, (worst, run.losses, local.losses)
    assert abs(float(run.summary["eval_loss"]) - float(local.summary["eval_loss"])) <= TOLERANCE
    assert run.summary["train_tokens"] == local.summary["train_tokens"]


@pytest.mark.parametrize("key", HYBRID)
def test_fsdp_hybrid_over_two_nodes_matches_the_local_ddp_run(key: str, runs: dict[str, Run]) -> None:
    """Four ranks on two nodes, each holding half of every parameter (sharded within its node,
    replicated across the two), 2 micro-batches a step: the same per-step losses and eval loss as
    4-process DDP at the same split."""
    import yaml

    local, run = runs["local-4"], runs[key]
    assert run.summary["world_size"] == 4 and run.summary["train_steps"] == 8
    training = yaml.safe_load((run.run_dir / "config.yaml").read_text())["training"]
    assert (training["per_device_train_batch_size"], training["gradient_accumulation_steps"]) == (2, 2)
    sharding = run.summary["sharding"]
    assert sharding["strategy"] == "fsdp" and sharding["mesh"] == {"dp_replicate": 2, "dp_shard": 2}, sharding
    assert abs(sharding["held_fraction"] - 0.5) <= 0.01, sharding
    places = re.findall(r"supertune: rank (\d) of 4 on (\S+) \(node (\d) of 2", run.log)
    assert sorted((p[0], p[1]) for p in places) == [("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")]
    worst = max(abs(run.losses[s] - local.losses[s]) for s in local.losses)
    print(f"{key} vs 4-process ddp: per-step loss {worst:.1e}")
    assert sorted(run.losses) == list(range(1, 9)) and worst <= FSDP_TOLERANCE, (worst, run.losses, local.losses)
    assert abs(float(run.summary["eval_loss"]) - float(local.summary["eval_loss"])) <= FSDP_TOLERANCE
    assert "Traceback" not in run.log, run.log[-4000:]


def test_launchers_agree_with_each_other(runs: dict[str, Run]) -> None:
    same = {k: r for k, r in runs.items() if k in (*JOBS, "local")}  # the world-size-2 runs
    final = {k: r.losses[8] for k, r in same.items()}
    evals = {k: float(r.summary["eval_loss"]) for k, r in same.items()}
    assert max(final.values()) - min(final.values()) <= TOLERANCE, final
    assert max(evals.values()) - min(evals.values()) <= TOLERANCE, evals


def test_deepspeed_launcher_starts_without_ssh_on_each_node(runs: dict[str, Run]) -> None:
    log = runs["deepspeed-2x1"].log
    ranks = sorted(re.findall(r"--node_rank=(\d)", log))
    assert ranks == ["0", "1"], log[-3000:]
    assert "pdsh" not in log and "ssh" not in log.replace("--no_ssh", "")


def test_srun_task_and_batch_script_see_their_own_place(slurm_multi: SlurmCluster, tmp_path: Path) -> None:
    """What Slurm really sets: the batch script (SLURM_PROCID=0, no step id) is no rank; each srun task is."""
    supertune_bin = Path(sys.executable).parent / "supertune"
    script = f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=2
{supertune_bin} env --json > batch.json
srun {supertune_bin} env --json
"""
    job = slurm_multi.sbatch(script, f"--output={tmp_path}/tasks.out", f"--chdir={tmp_path}")
    assert slurm_multi.wait(job, timeout=120) == "COMPLETED", (tmp_path / "tasks.out").read_text()
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert (batch["launcher"], batch["world_size"], batch["job_id"]) == ("none", 1, str(job))
    tasks = sorted(
        (json.loads(line) for line in (tmp_path / "tasks.out").read_text().splitlines()), key=lambda v: v["rank"]
    )
    assert [(t["rank"], t["node_rank"], t["world_size"], t["num_nodes"]) for t in tasks] == [(0, 0, 2, 2), (1, 1, 2, 2)]
    assert {t["launcher"] for t in tasks} == {"slurm"} and {t["master_addr"] for t in tasks} == {"node1"}
    assert {t["master_port"] for t in tasks} == {10000 + job % 20000}


# ---- what each launcher's processes are told (no cluster needed) --------------------------------


def test_deepspeed_launcher_variables_give_the_node() -> None:
    from supertune.launch.environment import launch_environment

    # What deepspeed.launcher.launch sets on the second of two nodes with one process each.
    env = {
        "RANK": "1",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
        "LOCAL_SIZE": "1",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "10004",
    }
    view = launch_environment(env)
    assert (view.node_rank, view.num_nodes, view.local_world_size, view.elastic_agent) == (1, 2, 1, False)


def test_torchrun_workers_know_their_agent() -> None:
    from supertune.launch.environment import launch_environment

    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "17",
    }
    view = launch_environment(env)
    assert (view.node_rank, view.num_nodes, view.elastic_agent) == (0, 2, True)


def test_only_srun_tasks_are_ranks() -> None:
    from supertune.launch.environment import launch_environment

    task = {
        "SLURM_JOB_ID": "9",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_NODEID": "1",
    }
    assert launch_environment(dict(task, SLURM_STEPID="0")).launcher == "slurm"  # the older name alone
    for step in ("interactive", "4294967293", "batch", "extern"):
        assert launch_environment(dict(task, SLURM_STEP_ID=step)).launcher == "none", step
