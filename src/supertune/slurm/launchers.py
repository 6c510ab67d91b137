"""The step command of each launcher: what srun runs on the nodes, as words (pure, no I/O).

- torchrun: one agent per node, c10d rendezvous on the first node, rendezvous id = job id.
- accelerate: one `accelerate launch` per node with a generated config for the fixed parts; the
  machine rank comes from SLURM_NODEID on each node. On CPU nodes the config still says MULTI_GPU:
  that mode starts N processes through torchrun, while accelerate's MULTI_CPU mode starts only one
  unless mpirun is used (the Trainer then runs them on the CPU with gloo).
- deepspeed: one deepspeed launcher per node with --no_ssh and its node rank, over a hostfile
  written from the allocation when the job starts: no pdsh or ssh between nodes.
- srun: srun starts every process itself; ranks come from SLURM (supertune.launch.environment).
"""

from __future__ import annotations

from .job import JobSpec
from .shell import Expand

__all__ = ["step_command", "accelerate_config", "WORKER_MODULE", "HOSTFILE", "ACCELERATE_CONFIG"]

WORKER_MODULE = "supertune.train.worker"
HOSTFILE = "hostfile"
ACCELERATE_CONFIG = "accelerate_config.yaml"

MASTER_ADDR = Expand("${MASTER_ADDR}")
MASTER_PORT = Expand("${MASTER_PORT}")
NODE_RANK = Expand("${SLURM_NODEID}")


def step_command(job: JobSpec, container: list[object]) -> tuple[list[object], bool]:
    """(words run by srun on each task, whether they must run under `bash -c` to expand per-node variables)."""
    python = [*container, job.python]
    if job.launcher == "srun":
        return [*python, "-m", WORKER_MODULE, job.run_dir], False
    if job.launcher == "torchrun":
        return [
            *python, "-m", "torch.distributed.run",
            Expand("--nnodes=${SLURM_JOB_NUM_NODES}"),
            f"--nproc-per-node={job.procs_per_node}",
            Expand("--rdzv-id=${SLURM_JOB_ID}"),
            "--rdzv-backend=c10d",
            Expand("--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}"),
            *([f"--max-restarts={job.launcher_restarts}"] if job.launcher_restarts else []),
            "-m", WORKER_MODULE, job.run_dir,
        ], False
    if job.launcher == "accelerate":
        return [
            *python, "-m", "accelerate.commands.launch",
            "--config_file", f"{job.run_dir}/{ACCELERATE_CONFIG}",
            "--num_machines", str(job.nodes),
            "--num_processes", str(job.world_size),
            "--machine_rank", NODE_RANK,
            "--main_process_ip", MASTER_ADDR,
            "--main_process_port", MASTER_PORT,
            *(["--max_restarts", str(job.launcher_restarts)] if job.launcher_restarts else []),
            "-m", WORKER_MODULE, job.run_dir,
        ], True
    if job.launcher == "deepspeed":
        return [
            *python, "-m", "deepspeed.launcher.runner",
            "--no_ssh",
            "--no_local_rank",  # the worker reads LOCAL_RANK from the environment, not from argv
            "--node_rank", NODE_RANK,
            "--hostfile", f"{job.run_dir}/{HOSTFILE}",
            "--master_addr", MASTER_ADDR,
            "--master_port", MASTER_PORT,
            "--module", WORKER_MODULE, job.run_dir,
        ], True
    raise ValueError(f"unknown launcher {job.launcher!r}")


def accelerate_config(job: JobSpec, mixed_precision: str) -> str:
    """The fixed part of `accelerate launch`'s configuration (YAML); per-node values come on its command line."""
    lines = [
        "# Written by supertune for this run; the command line in job.sbatch adds the per-node values.",
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: MULTI_GPU",
        f"mixed_precision: '{mixed_precision}'",
        f"num_machines: {job.nodes}",
        f"num_processes: {job.world_size}",
        "rdzv_backend: static",
        "same_network: true",
        "main_training_function: main",
        "use_cpu: false",
        "",
    ]
    return "\n".join(lines)
