"""The launchers a SLURM job can start its processes with: one record each, and nothing else
anywhere knows them by name. The config's choices, validation, `--help`, the job script and the
launcher's own files all derive from this table; adding a launcher is one record (plus the golden
job scripts that pin its rendering).

- torchrun: one agent per node, c10d rendezvous on the first node, rendezvous id = job id.
- accelerate: one `accelerate launch` per node with a generated config for the fixed parts; the
  machine rank comes from SLURM_NODEID on each node. On CPU nodes the config still says MULTI_GPU:
  that mode starts N processes through torchrun, while accelerate's MULTI_CPU mode starts only one
  unless mpirun is used (the Trainer then runs them on the CPU with gloo).
- deepspeed: one deepspeed launcher per node with --no_ssh and its node rank, over a hostfile
  written from the allocation when the job starts: no pdsh or ssh between nodes.
- srun: srun starts every process itself; ranks come from SLURM (supertune.launch.environment).

Building a step is pure: words in, words out, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..entry import ENTRY_MODULE, TRAIN_WORKER
from ..rundir import RunDir
from .command_words import Expand

__all__ = [
    "Launcher",
    "StepPlan",
    "LAUNCHERS",
    "HOSTFILE",
    "ACCELERATE_CONFIG",
    "launcher_names",
    "get_launcher",
    "accelerate_config",
]

HOSTFILE = "hostfile"
"""Need: the job writes the allocation's hosts with their process slots to RunDir.hostfile before the step."""
ACCELERATE_CONFIG = "accelerate_config"
"""Need: `submit` writes accelerate's fixed settings to RunDir.accelerate_config (see accelerate_config)."""

MASTER_ADDR = Expand("${MASTER_ADDR}")
MASTER_PORT = Expand("${MASTER_PORT}")
NODE_RANK = Expand("${SLURM_NODEID}")


@dataclass(frozen=True)
class StepPlan:
    """What a launcher's command is built from."""

    run_dir: str
    nodes: int
    procs_per_node: int
    restarts: int
    """Restarts of a node's processes after a failure (launch.max_restarts), where the launcher can."""
    python: tuple[object, ...]
    """The interpreter on the nodes, after the container prefix if any."""
    entry: str = TRAIN_WORKER
    """What every process runs, an entry point of supertune.entry: training, or the doctor's pre-flight."""
    args: tuple[str, ...] | None = None
    """The entry point's arguments; None: the run directory (what the training worker takes)."""
    rendezvous_suffix: str = ""
    """Added to the job id of a rendezvous id, so that a second step of the same job meets apart from the first."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def run(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def module(self) -> str:
        """The module every process runs (python -m MODULE ARGS): the table of entry points."""
        return ENTRY_MODULE

    @property
    def module_args(self) -> list[str]:
        """The module's arguments: the entry point's name, then its own."""
        return [self.entry, *(self.args if self.args is not None else [self.run_dir])]


@dataclass(frozen=True)
class Launcher:
    """One way of starting a job's training processes on its nodes."""

    name: str
    summary: str
    """One line for --help and the docs."""
    step: Callable[[StepPlan], list[object]]
    """The words srun runs on each of its tasks."""
    one_task_per_process: bool = False
    """srun starts every process (srun); otherwise one launcher agent per node starts the node's processes."""
    per_node_values: bool = False
    """The words name values of each node (${SLURM_NODEID}), so they run under `bash -c` on the node."""
    needs: tuple[str, ...] = field(default=())
    """Files the job prepares for it: HOSTFILE, ACCELERATE_CONFIG."""


def _srun(p: StepPlan) -> list[object]:
    return [*p.python, "-m", p.module, *p.module_args]


def _torchrun(p: StepPlan) -> list[object]:
    return [
        *p.python,
        "-m",
        "torch.distributed.run",
        Expand("--nnodes=${SLURM_JOB_NUM_NODES}"),
        f"--nproc-per-node={p.procs_per_node}",
        Expand("--rdzv-id=${SLURM_JOB_ID}" + p.rendezvous_suffix),
        "--rdzv-backend=c10d",
        Expand("--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}"),
        *([f"--max-restarts={p.restarts}"] if p.restarts else []),
        "-m",
        p.module,
        *p.module_args,
    ]


def _accelerate(p: StepPlan) -> list[object]:
    return [
        *p.python,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(p.run.accelerate_config),
        "--num_machines",
        str(p.nodes),
        "--num_processes",
        str(p.world_size),
        "--machine_rank",
        NODE_RANK,
        "--main_process_ip",
        MASTER_ADDR,
        "--main_process_port",
        MASTER_PORT,
        *(["--max_restarts", str(p.restarts)] if p.restarts else []),
        "-m",
        p.module,
        *p.module_args,
    ]


def _deepspeed(p: StepPlan) -> list[object]:
    return [
        *p.python,
        "-m",
        "deepspeed.launcher.runner",
        "--no_ssh",
        "--no_local_rank",  # the worker reads LOCAL_RANK from the environment, not from argv
        "--node_rank",
        NODE_RANK,
        "--hostfile",
        str(p.run.hostfile),
        "--master_addr",
        MASTER_ADDR,
        "--master_port",
        MASTER_PORT,
        "--module",
        p.module,
        *p.module_args,
    ]


LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        Launcher("torchrun", "torchrun on each node, c10d rendezvous on the first", _torchrun),
        Launcher(
            "accelerate",
            "accelerate launch on each node, static rendezvous",
            _accelerate,
            per_node_values=True,
            needs=(ACCELERATE_CONFIG,),
        ),
        Launcher(
            "deepspeed",
            "the deepspeed launcher on each node over a hostfile, no ssh",
            _deepspeed,
            per_node_values=True,
            needs=(HOSTFILE,),
        ),
        Launcher("srun", "srun starts every process, no rendezvous server", _srun, one_task_per_process=True),
    )
}
"""Every launcher by name, in the order `--help` lists them."""


def launcher_names() -> list[str]:
    """Names of the launchers, as `launch.launcher` and `submit --launcher` accept them."""
    return list(LAUNCHERS)


def get_launcher(name: str) -> Launcher:
    """The record of a launcher that validation has accepted."""
    return LAUNCHERS[name]


def accelerate_config(p: StepPlan, mixed_precision: str) -> str:
    """The fixed part of `accelerate launch`'s configuration (YAML); per-node values come on its command line."""
    lines = [
        "# Written by supertune for this run; the command line in job.sbatch adds the per-node values.",
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: MULTI_GPU",
        f"mixed_precision: '{mixed_precision}'",
        f"num_machines: {p.nodes}",
        f"num_processes: {p.world_size}",
        "rdzv_backend: static",
        "same_network: true",
        "main_training_function: main",
        "use_cpu: false",
        "",
    ]
    return "\n".join(lines)
