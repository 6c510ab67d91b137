"""What a SLURM job needs, resolved once from the run config and the cluster profile.

Both are validated before this point (config validation checks the slurm.* values, profile
validation the profile's), so nothing here can fail on a user's value.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig
from ..doctor.options import preflight_arguments
from ..entry import DOCTOR_WORKER, TRAIN_WORKER
from ..launch.launchers import StepPlan, get_launcher
from ..rundir import RunDir

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
    preflight: tuple[str, ...] | None = None
    """Arguments of the doctor's pre-flight step (slurm.preflight), None: no pre-flight."""
    entry: str = TRAIN_WORKER
    """What every process runs, an entry point of supertune.entry: the training worker, or another
    job's (a federated site's evaluation)."""
    entry_args: tuple[str, ...] | None = None
    """The entry point's arguments; None: the run directory."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def tasks_per_node(self) -> int:
        """srun tasks per node: every process when srun starts them all, else one launcher agent per node."""
        return self.procs_per_node if get_launcher(self.launcher).one_task_per_process else 1

    @property
    def cpus_per_task(self) -> int:
        return self.cpus_per_proc * (self.procs_per_node // self.tasks_per_node)

    def step_plan(self, container: list[object]) -> StepPlan:
        """What the launcher's command is built from, with the container prefix (if any) before python."""
        return StepPlan(
            self.run_dir, self.nodes, self.procs_per_node, self.launcher_restarts, (*container, self.python),
            entry=self.entry, args=self.entry_args,
        )  # fmt: skip

    def preflight_plan(self, container: list[object]) -> StepPlan:
        """The pre-flight step: the same launcher and processes, running the doctor instead of training.
        It meets under its own rendezvous id and is never restarted (a failure is its answer)."""
        return StepPlan(
            self.run_dir, self.nodes, self.procs_per_node, 0, (*container, self.python),
            entry=DOCTOR_WORKER, args=self.preflight, rendezvous_suffix="-preflight",
        )  # fmt: skip


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
        partition=slurm.partition or profile.partition or None,
        account=slurm.account or profile.account or None,
        qos=slurm.qos or profile.qos or None,
        mem=slurm.mem or None,
        exclusive=slurm.exclusive,
        extra_args=tuple(slurm.extra_args),
        python="python3" if in_container else python,
        master_port=la.master_port,
        signal_lead=slurm.signal_lead,
        max_restarts=slurm.max_restarts,
        launcher_restarts=la.max_restarts,
        preflight=tuple(
            preflight_arguments(slurm.preflight_gbps, str(RunDir(run_dir).preflight_report), slurm.preflight_max_size)
        )
        if slurm.preflight
        else None,
    )
