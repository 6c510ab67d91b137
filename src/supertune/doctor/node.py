"""The report of one node: read the machine once, then run every check on what was read."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..launch.environment import LaunchEnvironment, SlurmAllocation, launch_environment, slurm_allocation
from ..paths import cache_dir
from . import probe
from .gpus import check_gpu_visibility, check_gpus, check_nccl
from .job import check_rendezvous, check_slurm
from .nccl_settings import check_nccl_debug, check_nccl_ib_hca
from .network import check_fabric, check_gloo_socket_ifname, check_nccl_socket_ifname, find_net_plugins
from .result import CheckResult
from .software import REPORTED_PACKAGES, check_packages, check_python, check_torch_build
from .storage import (
    HfPaths,
    check_free_space,
    check_hf_cache,
    check_offline,
    check_scratch,
    check_tmpdir,
    hf_paths,
    is_true,
)

__all__ = ["NodeFacts", "gather", "run_checks", "CHECK_NAMES"]

CHECK_NAMES = (
    "python", "packages", "torch-build",
    "gpu-visibility", "gpus", "nccl", "nccl-debug",
    "fabric", "nccl-ib-hca", "nccl-socket-ifname", "gloo-socket-ifname",
    "slurm", "rendezvous",
    "hf-cache", "hf-offline", "scratch", "tmpdir", "free-space",
)  # fmt: skip


@dataclass(frozen=True)
class NodeFacts:
    """Everything the checks look at, read once from this node and this process's environment."""

    env: Mapping[str, str]
    hostname: str
    python: tuple[int, int, int]
    executable: str
    packages: Mapping[str, str | None]
    pins: Mapping[str, str]
    torch: probe.TorchFacts
    hardware: probe.GpuHardware
    interfaces: Sequence[probe.NetInterface]
    ib_ports: Sequence[probe.IbPort]
    cxi_devices: Sequence[str]
    plugins: Sequence[str]
    view: LaunchEnvironment
    allocation: SlurmAllocation | None
    hf: HfPaths
    dirs: Sequence[tuple[str, Path]]
    """Directories a run writes to: (what, path)."""


def gather(view: LaunchEnvironment | None = None, extra_dirs: Sequence[str] = ()) -> NodeFacts:
    """Read this node and this process's environment (`view`: the launch view, if already read)."""
    env = dict(os.environ)
    hf = hf_paths(env, Path.home())
    return NodeFacts(
        env=env,
        hostname=socket.gethostname(),
        python=tuple(sys.version_info[:3]),  # type: ignore[arg-type]
        executable=sys.executable,
        packages=probe.package_versions(REPORTED_PACKAGES),
        pins=probe.pinned_versions(),
        torch=probe.read_torch(),
        hardware=probe.read_gpu_hardware(),
        interfaces=probe.read_interfaces(),
        ib_ports=probe.read_ib_ports(),
        cxi_devices=probe.read_cxi_devices(),
        plugins=find_net_plugins(env),
        view=view or launch_environment(env),
        allocation=slurm_allocation(env),
        hf=hf,
        dirs=_written_dirs(env, extra_dirs),
    )


def run_checks(
    facts: NodeFacts, min_free_bytes: int, resolve: Callable[[str], list[str]] = probe.resolve_host
) -> list[CheckResult]:
    """Every node check, in the order of the report (CHECK_NAMES)."""
    f = facts
    nodes = max(f.view.num_nodes, (f.allocation.num_nodes or 1) if f.allocation else 1)
    nccl_used = f.torch.device_count > 0 and f.torch.nccl
    return [
        check_python(f.python, f.executable),
        check_packages(f.packages, f.pins),
        check_torch_build(f.torch, f.hardware),
        check_gpu_visibility(f.torch, f.hardware, f.allocation, f.env),
        check_gpus(f.torch),
        check_nccl(f.torch, f.env),
        check_nccl_debug(f.env, f.torch),
        check_fabric(f.ib_ports, f.cxi_devices, f.interfaces, f.env, f.plugins, f.torch),
        check_nccl_ib_hca(f.env, f.ib_ports),
        check_nccl_socket_ifname(f.env, f.interfaces, nodes, nccl_used),
        check_gloo_socket_ifname(f.env, f.interfaces, f.hostname, resolve, nodes),
        check_slurm(f.allocation, f.view),
        check_rendezvous(f.view, resolve),
        check_hf_cache(f.hf, is_true(f.env.get("HF_HUB_OFFLINE"))),
        check_offline(f.env, f.allocation is not None),
        check_scratch(f.dirs),
        check_tmpdir(f.env),
        check_free_space([*f.dirs, ("Hugging Face cache", f.hf.home)], min_free_bytes),
    ]


def _written_dirs(env: Mapping[str, str], extra: Sequence[str]) -> list[tuple[str, Path]]:
    # A job script exports SUPERTUNE_RUN_DIR; elsewhere runs go to ./runs (output.runs_root).
    run_dir = Path(env["SUPERTUNE_RUN_DIR"]) if env.get("SUPERTUNE_RUN_DIR") else Path.cwd() / "runs"
    dirs = [
        ("run directory", run_dir),
        ("supertune cache", cache_dir()),
        ("temporary files", Path(tempfile.gettempdir())),
    ]
    for variable in ("SCRATCH", "LOCAL_SCRATCH"):
        if env.get(variable):
            dirs.append((f"${variable}", Path(env[variable])))
    dirs += [("--dir", Path(d)) for d in extra]
    unique, seen = [], set()
    for label, path in dirs:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((label, path))
    return unique
