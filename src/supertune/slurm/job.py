"""What a SLURM job needs, resolved once from the run config and the cluster profile."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig
from ..errors import UserError

__all__ = ["JobSpec", "job_spec"]


@dataclass(frozen=True)
class JobSpec:
    """Everything the job script renderer reads; a pure value, easy to pin in golden files."""

    name: str
    run_dir: str
    launcher: str
    nodes: int
    procs_per_node: int
    """Training processes per node: one per GPU, or launch.procs_per_node on CPU nodes."""
    gpus_per_node: int
    cpus_per_proc: int
    time: str
    partition: str | None
    account: str | None
    qos: str | None
    mem: str | None
    exclusive: bool
    extra_args: tuple[str, ...]
    python: str
    """Interpreter on the compute nodes: the submitting one (a shared filesystem), or python in a container."""
    master_port: int | None
    """Fixed rendezvous port; None derives it from the job id when the job starts."""
    signal_lead: int = 300
    """Seconds before the time limit at which the batch shell gets USR1."""
    max_restarts: int = 20
    """Requeues after a stop on USR1 (SLURM_RESTART_COUNT counts them)."""
    launcher_restarts: int = 0
    """torchrun / accelerate: restarts of a node's processes after a failure (launch.max_restarts)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def tasks_per_node(self) -> int:
        """srun tasks per node: every process for the srun launcher, one node agent for the others."""
        return self.procs_per_node if self.launcher == "srun" else 1

    @property
    def cpus_per_task(self) -> int:
        return self.cpus_per_proc * (self.procs_per_node // self.tasks_per_node)


def job_spec(cfg: RunConfig, profile: ClusterProfile, run_dir: str, python: str) -> JobSpec:
    """Combine the run config (which wins) with the cluster profile (which fills what is left empty)."""
    la, slurm = cfg.launch, cfg.slurm
    gpus = la.gpus_per_node if la.gpus_per_node is not None else profile.gpus_per_node
    procs = gpus if gpus > 0 else (la.procs_per_node or 1)
    if gpus > 0:
        cpus = profile.cpus_per_gpu
    else:
        cpus = max(1, profile.cpus_per_node // procs)
    in_container = profile.container.runtime != "none" and profile.container.image
    return JobSpec(
        name=cfg.output.name,
        run_dir=run_dir,
        launcher=la.launcher,
        nodes=la.nodes,
        procs_per_node=procs,
        gpus_per_node=gpus,
        cpus_per_proc=cpus,
        time=slurm.time,
        partition=_scheduler_name("partition", slurm.partition, profile.partition),
        account=_scheduler_name("account", slurm.account, profile.account),
        qos=_scheduler_name("qos", slurm.qos, profile.qos),
        mem=_memory(slurm.mem),
        exclusive=slurm.exclusive,
        extra_args=tuple(slurm.extra_args),
        python="python3" if in_container else python,
        master_port=la.master_port,
        signal_lead=slurm.signal_lead,
        max_restarts=slurm.max_restarts,
        launcher_restarts=la.max_restarts,
    )


# What Slurm accepts as partition, account and QOS names (a partition may also be a list: a,b).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.,:+@-]+$")
_MEMORY = re.compile(r"^[0-9]+[KMGT]?$")


def _scheduler_name(key: str, own: str | None, profile_value: str | None) -> str | None:
    # Checked here rather than left to sbatch: a bad value then fails at once, naming the key to fix.
    value, field = (own, f"slurm.{key}") if own else (profile_value, f"cluster profile {key}")
    if value and not _SLURM_NAME.match(value):
        raise UserError(f"{field}: {value!r} is not a Slurm name (letters, digits, _ . , : + @ -)")
    return value or None


def _memory(mem: str | None) -> str | None:
    if mem and not _MEMORY.match(mem):
        raise UserError(f"slurm.mem: {mem!r} is not a Slurm memory size; write e.g. 480G or 64000M")
    return mem or None
