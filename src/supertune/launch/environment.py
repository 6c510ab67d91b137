"""The one module that reads the launch environment: who this process is in the job, and who said so.

Sources, first match wins:
1. torchrun, `accelerate launch` and the deepspeed launcher: RANK, LOCAL_RANK, WORLD_SIZE,
   MASTER_ADDR, MASTER_PORT, and the node's place where the launcher says it: GROUP_RANK and
   LOCAL_WORLD_SIZE (torchrun, and accelerate, which runs torchrun), or CROSS_RANK, CROSS_SIZE and
   LOCAL_SIZE (the deepspeed launcher);
2. a SLURM job step started by srun: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID,
   SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST (expanded with python-hostlist; the first host is the
   master) and a port derived from SLURM_JOB_ID: no rendezvous server at all, which is what lets
   plain srun scale to hundreds of nodes;
3. MPI (Open MPI's OMPI_COMM_WORLD_*, or PMI_RANK / PMI_SIZE);
4. otherwise a single process.
Everything else in supertune asks this module instead of reading those variables; the SLURM
allocation itself (nodes, tasks, CPUs and GPUs granted, whoever started the process) is
`slurm_allocation`. A variable that cannot be read (`WORLD_SIZE=abc`, `SLURM_NODELIST='node[1-'`)
is a `LaunchVariableError`: one line naming it, its value and the launcher that sets it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass

from ..errors import UserError

__all__ = [
    "LaunchVariableError",
    "LaunchEnvironment",
    "launch_environment",
    "port_for_job",
    "expand_nodelist",
    "export_for_torch",
    "SlurmAllocation",
    "slurm_allocation",
]

# Ports derived from job ids fall in [10000, 30000): below Linux's ephemeral range (32768+), and
# two jobs sharing a node collide only when their ids differ by a multiple of 20000.
PORT_BASE = 10000
PORT_SPAN = 20000

# Who sets which variable, by name prefix, first match wins: said in the error for a garbage value.
_SET_BY = (
    ("SLURM_", "Slurm (sbatch, salloc and srun)"),
    ("OMPI_", "Open MPI's mpirun"),
    ("PMI", "the MPI launcher (PMI)"),
    ("MPI_", "the MPI launcher"),
    ("CROSS_", "the deepspeed launcher"),
    ("LOCAL_SIZE", "the deepspeed launcher"),
    ("TORCHELASTIC_", "torchrun's agent"),
)


class LaunchVariableError(UserError):
    """A launcher's or scheduler's variable that holds what its launcher would never write."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(
            f"{name}={value!r} in the environment is not {expected}; {set_by(name)} sets it: unset it, "
            "or start supertune through that launcher"
        )


def set_by(name: str) -> str:
    """The launcher that sets variable `name`, in words."""
    for prefix, launcher in _SET_BY:
        if name.startswith(prefix):
            return launcher
    return "torchrun (also under accelerate and the deepspeed launcher)"


@dataclass(frozen=True)
class LaunchEnvironment:
    """Rank, sizes and rendezvous address of the current process, and which launcher said so."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"
    """torchrun (also accelerate and deepspeed), slurm, mpi or none."""
    job_id: str | None = None
    """SLURM job id when inside a job."""
    device_index: int = 0
    """Accelerator index for this process: 0 when the task sees exactly one device, else local_rank."""
    elastic_agent: bool = False
    """Whether a torchrun agent (torchrun itself, or accelerate's) started and watches this process."""
    restart_count: int = 0
    """How often a torchrun agent has restarted this process's group after a failure (--max-restarts)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def lacks_torch_variables(self) -> bool:
        """Started by srun or mpirun, which set only their own variables (see export_for_torch)."""
        return self.launcher in ("slurm", "mpi")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def port_for_job(job_id: str | int) -> int:
    """Rendezvous port of a SLURM job: stable for the job, different for jobs that share a node."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def expand_nodelist(nodelist: str, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Host names of a Slurm node list such as "gpu[01-04,07],login1" (LaunchVariableError naming
    variable `name` when it is not one)."""
    import hostlist

    try:
        return list(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist:
        raise LaunchVariableError(name, nodelist, "a Slurm node list such as gpu[01-04,07]") from None


def launch_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """The launch view of this process, from the first source that describes it."""
    env = os.environ if environ is None else environ
    for read in (_from_torchrun, _from_slurm_step, _from_mpi):
        found = read(env)
        if found is not None:
            return found
    return LaunchEnvironment(job_id=_job_id(env), device_index=0)


def export_for_torch(view: LaunchEnvironment, environ: MutableMapping[str, str] | None = None) -> None:
    """Write RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for torch.distributed's env:// init.

    Needed when processes were started by srun or mpirun, which set only their own variables.
    """
    env = os.environ if environ is None else environ
    env["RANK"] = str(view.rank)
    # accelerate and the Trainer pick the GPU by LOCAL_RANK. A task narrowed to one visible GPU must
    # use device 0, so LOCAL_RANK says 0 there; the cost: every such task counts as its node's
    # "local main" process, which only matters for per-node caches supertune does not use.
    env["LOCAL_RANK"] = str(view.device_index)
    env["WORLD_SIZE"] = str(view.world_size)
    env["LOCAL_WORLD_SIZE"] = str(view.local_world_size)
    env["GROUP_RANK"] = str(view.node_rank)
    if view.master_addr:
        env["MASTER_ADDR"] = view.master_addr
    if view.master_port:
        env["MASTER_PORT"] = str(view.master_port)


def _device_index(env: Mapping[str, str], local_rank: int) -> int:
    # SLURM's --gpus-per-task / --gpu-bind narrow the visible devices of each task to one: that
    # device is then index 0 in the process, whatever the task's local rank.
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        visible = env.get(name)
        if visible is not None and visible.strip() and len(visible.split(",")) == 1:
            return 0
    return local_rank


def _int(env: Mapping[str, str], *names: str, default: int | None = None, least: int = 0) -> int | None:
    """The first of `names` that is set, as a whole number of at least `least` (LaunchVariableError
    otherwise); `default` when none is set."""
    for name in names:
        value = env.get(name)
        if value in (None, ""):
            continue
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or int(text) < least:
            raise LaunchVariableError(name, value, "a whole number" + (f" of at least {least}" if least else ""))
        return int(text)
    return default


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    """The name of the first of `names` that is set and not empty."""
    return next((name for name in names if env.get(name)), None)


def _from_torchrun(env: Mapping[str, str]) -> LaunchEnvironment | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    local_rank = _int(env, "LOCAL_RANK", default=0) or 0
    world = _int(env, "WORLD_SIZE", least=1) or 1
    local_world = _int(env, "LOCAL_WORLD_SIZE", "LOCAL_SIZE", default=world, least=1) or world
    return LaunchEnvironment(
        rank=_int(env, "RANK", default=0) or 0,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=_int(env, "GROUP_RANK", "CROSS_RANK", "NODE_RANK", default=0) or 0,
        num_nodes=_int(env, "CROSS_SIZE", default=None, least=1) or max(1, world // max(local_world, 1)),
        master_addr=env.get("MASTER_ADDR"),
        master_port=_int(env, "MASTER_PORT"),
        launcher="torchrun",
        job_id=_job_id(env),
        device_index=_device_index(env, local_rank),
        # torchrun's agents give their workers the rendezvous run id; the deepspeed launcher does not.
        elastic_agent="TORCHELASTIC_RUN_ID" in env,
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", default=0) or 0,
    )


# Steps that are not srun tasks of the job: a batch script, the extern step, salloc's interactive
# shell (by name, or by Slurm's numeric ids for them).
_NOT_TASK_STEPS = frozenset({"batch", "extern", "interactive", "4294967293", "4294967294", "4294967295"})


def _from_slurm_step(env: Mapping[str, str]) -> LaunchEnvironment | None:
    # SLURM_PROCID is also set (to 0) in the batch script itself, which has no SLURM_STEP_ID (checked
    # on the test cluster: a batch script sees SLURM_PROCID=0 and no step id; an srun task sees
    # SLURM_STEP_ID=0 and its SLURM_STEPID alias). Only an srun task describes a rank of the job.
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if "SLURM_PROCID" not in env or not step or step in _NOT_TASK_STEPS:
        return None
    job_id = _job_id(env)
    nodelist_name = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    hosts = expand_nodelist(env[nodelist_name], nodelist_name) if nodelist_name else []
    local_rank = _int(env, "SLURM_LOCALID", default=0) or 0
    world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1, least=1) or 1
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1, least=1) or 1
    port = _int(env, "MASTER_PORT")
    return LaunchEnvironment(
        rank=_int(env, "SLURM_PROCID", default=0) or 0,
        local_rank=local_rank,
        world_size=world,
        local_world_size=_tasks_on_this_node(env, world, nodes),
        node_rank=_int(env, "SLURM_NODEID", default=0) or 0,
        num_nodes=nodes,
        master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else None),
        master_port=port if port else (port_for_job(job_id) if job_id else None),
        launcher="slurm",
        job_id=job_id,
        device_index=_device_index(env, local_rank),
    )


# One entry of SLURM_TASKS_PER_NODE: a count, or a count repeated for that many nodes ("2(x3)").
_TASKS_ENTRY = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _tasks_on_this_node(env: Mapping[str, str], world: int, nodes: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": the count for this node is needed, so expand it
    # only as far as that node (a repeat count can be as large as the job's nodes).
    name = _first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID", default=0) or 0
    if name:
        first = 0
        for count, repeat in _tasks_per_node(name, env[name]):
            if node < first + repeat:
                return count
            first += repeat
    return max(1, world // max(nodes, 1))


def _tasks_per_node(name: str, spec: str) -> list[tuple[int, int]]:
    """(tasks, nodes) of each entry of a SLURM_TASKS_PER_NODE value, e.g. "2(x3),1" -> [(2, 3), (1, 1)]."""
    entries = []
    for part in spec.split(","):
        match = _TASKS_ENTRY.fullmatch(part.strip())
        if match is None:
            raise LaunchVariableError(name, spec, 'a Slurm tasks-per-node list such as "2(x3),1"')
        entries.append((int(match.group(1)), int(match.group(2) or 1)))
    return entries


def _from_mpi(env: Mapping[str, str]) -> LaunchEnvironment | None:
    rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    world = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    if rank is None or world is None:
        return None
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default=0) or 0
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", default=world) or world
    return LaunchEnvironment(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=rank // max(local_world, 1),
        num_nodes=max(1, world // max(local_world, 1)),
        master_addr=env.get("MASTER_ADDR"),
        master_port=_int(env, "MASTER_PORT"),
        launcher="mpi",
        job_id=_job_id(env),
        device_index=_device_index(env, local_rank),
    )


@dataclass(frozen=True)
class SlurmAllocation:
    """What SLURM granted the job this process runs in, as its SLURM_* variables say (no rank logic)."""

    job_id: str
    job_name: str | None = None
    partition: str | None = None
    nodelist: str | None = None
    num_nodes: int | None = None
    ntasks: int | None = None
    tasks_per_node: str | None = None
    """As SLURM writes it, e.g. "4(x2)"."""
    cpus_per_task: int | None = None
    cpus_on_node: int | None = None
    gpus_on_node: int | None = None
    """GPUs granted on this node (SLURM_GPUS_ON_NODE, else counted from the GPU id lists or the
    per-node request); None when the job asked for none or SLURM does not say."""
    gpu_variables: tuple[tuple[str, str], ...] = ()
    """Every GPU-related SLURM variable that is set, (name, value), for reports."""
    step_id: str | None = None
    restart_count: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_GPU_VARIABLES = (
    "SLURM_GPUS_ON_NODE",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPUS",
    "SLURM_TRES_PER_TASK",
)


def slurm_allocation(environ: Mapping[str, str] | None = None) -> SlurmAllocation | None:
    """The allocation of the SLURM job this process belongs to; None outside a job."""
    env = os.environ if environ is None else environ
    job_id = _job_id(env)
    if not job_id:
        return None
    nodelist_name = _first_set(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist_name:
        expand_nodelist(env[nodelist_name], nodelist_name)  # checked here, so no later reader trips on it
    if env.get("SLURM_TASKS_PER_NODE"):
        _tasks_per_node("SLURM_TASKS_PER_NODE", env["SLURM_TASKS_PER_NODE"])
    return SlurmAllocation(
        job_id=job_id,
        job_name=env.get("SLURM_JOB_NAME"),
        partition=env.get("SLURM_JOB_PARTITION"),
        nodelist=env[nodelist_name] if nodelist_name else None,
        num_nodes=_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", least=1),
        ntasks=_int(env, "SLURM_NTASKS", "SLURM_NPROCS", least=1),
        tasks_per_node=env.get("SLURM_TASKS_PER_NODE"),
        cpus_per_task=_int(env, "SLURM_CPUS_PER_TASK", least=1),
        cpus_on_node=_int(env, "SLURM_CPUS_ON_NODE", least=1),
        gpus_on_node=_gpus_on_node(env),
        gpu_variables=tuple((name, env[name]) for name in _GPU_VARIABLES if env.get(name)),
        step_id=env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"),
        restart_count=_int(env, "SLURM_RESTART_COUNT", default=0) or 0,
    )


def _job_id(env: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID (or its old alias), checked to be a job id: it becomes a port and a file name."""
    name = _first_set(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if name is None:
        return None
    # An array task's own id is a plain number too; "123_4" is only how squeue shows it.
    return str(_int(env, name))


def _gpus_on_node(env: Mapping[str, str]) -> int | None:
    # SLURM_GPUS_ON_NODE is the count itself (Slurm 20.11+). The id lists ("0,1,2,3") name the
    # GPUs of the step or job on this node; --gpus-per-node may carry a type ("a100:4").
    count = _int(env, "SLURM_GPUS_ON_NODE")
    if count is not None:
        return count
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = env.get(name, "").strip()
        if ids:
            return len([i for i in ids.split(",") if i.strip()])
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node:
        # --gpus-per-node=[type:]count, a comma list for several types ("a100:2,v100:1": 3 GPUs).
        counts = [entry.strip().rsplit(":", 1)[-1] for entry in per_node.split(",")]
        if not all(c.isascii() and c.isdigit() for c in counts):
            raise LaunchVariableError(
                "SLURM_GPUS_PER_NODE", env["SLURM_GPUS_PER_NODE"], 'a GPU count per node such as "4" or "a100:4"'
            )
        return sum(int(c) for c in counts)
    return None
