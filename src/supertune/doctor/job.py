"""Checks of the job around this process: the SLURM allocation, and the rendezvous address every
process of a distributed run must reach."""

from __future__ import annotations

from collections.abc import Callable

from ..launch.environment import LaunchEnvironment, SlurmAllocation
from .result import CheckResult, fail, not_applicable, ok

__all__ = ["check_slurm", "check_rendezvous"]


def check_slurm(allocation: SlurmAllocation | None, view: LaunchEnvironment) -> CheckResult:
    """The allocation's variables, and no more processes on a node than it has GPUs (NCCL refuses two
    ranks on one GPU)."""
    name = "slurm"
    if allocation is None:
        return not_applicable(name, "not inside a SLURM job (no SLURM_JOB_ID)")
    a = allocation
    parts = [f"job {a.job_id}" + (f" ({a.job_name})" if a.job_name else "")]
    if a.num_nodes is not None:
        parts.append(f"{a.num_nodes} node(s) {a.nodelist or ''}".rstrip())
    if a.partition:
        parts.append(f"partition {a.partition}")
    if a.ntasks is not None:
        parts.append(f"{a.ntasks} task(s)" + (f" ({a.tasks_per_node} per node)" if a.tasks_per_node else ""))
    if a.cpus_per_task is not None:
        parts.append(f"{a.cpus_per_task} CPU(s) per task")
    parts.append(f"GPUs on this node: {a.gpus_on_node if a.gpus_on_node is not None else 'none'}")
    if a.restart_count:
        parts.append(f"restart {a.restart_count}")
    step = f"step {a.step_id}" if a.step_id else "batch script (no job step)"
    parts.append(f"{step}; this process: rank {view.rank} of {view.world_size} ({view.launcher})")
    evidence = ", ".join(parts)
    if a.gpus_on_node and view.local_world_size > a.gpus_on_node and view.launcher != "none":
        return fail(
            name,
            f"{evidence}; {view.local_world_size} processes on this node share {a.gpus_on_node} GPU(s): NCCL refuses two ranks on one GPU",
            "start one process per GPU (launch.procs_per_node, or --ntasks-per-node with the srun launcher)",
        )
    return ok(name, evidence)


def check_rendezvous(view: LaunchEnvironment, resolve: Callable[[str], list[str]]) -> CheckResult:
    """A distributed run needs a master address that resolves and a valid port."""
    name = "rendezvous"
    if not view.distributed:
        return not_applicable(
            name, "one process: no rendezvous (torchrun, srun or --nproc set MASTER_ADDR for several)"
        )
    where = f"rank {view.rank} of {view.world_size} ({view.launcher})"
    if not view.master_addr or view.master_port is None:
        return fail(
            name,
            f"{where} but MASTER_ADDR={view.master_addr or 'unset'}, MASTER_PORT={view.master_port or 'unset'}",
            "start the processes with torchrun, srun (inside a job) or supertune's --nproc, or export MASTER_ADDR and MASTER_PORT",
        )
    if not 0 < view.master_port < 65536:
        return fail(
            name,
            f"{where}: MASTER_PORT={view.master_port} is not a TCP port",
            "use a port between 1024 and 65535 that no other job on the node uses",
        )
    try:
        addresses = resolve(view.master_addr)
    except OSError as exc:
        return fail(
            name,
            f"{where}: MASTER_ADDR={view.master_addr} does not resolve ({exc})",
            'use the first host of the allocation: MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        )
    return ok(name, f"{where}: master {view.master_addr}:{view.master_port} ({', '.join(addresses)})")
