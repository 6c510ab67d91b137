"""NCCL's own variables that NCCL reads without a word when they say nothing it knows: NCCL_IB_HCA
naming no RDMA device of the node (NCCL then finds no InfiniBand device and uses TCP sockets), and
NCCL_DEBUG that is not one of its levels (NCCL then prints nothing, the opposite of what was asked).

Both are warnings: the run works, slower or silent. They are checked on every node, GPUs or not: a
login node or a CPU node with the variables of the GPU nodes (a cluster profile's env:) shows them.
NCCL_SOCKET_IFNAME, whose list matching nothing stops NCCL, is `network.check_nccl_socket_ifname`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .network import parse_ifname_list
from .probe import IbPort, TorchFacts
from .result import CheckResult, not_applicable, ok, warn

__all__ = ["NCCL_DEBUG_LEVELS", "RCCL_DEBUG_LEVELS", "check_nccl_debug", "check_nccl_ib_hca"]

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
"""NCCL_DEBUG's levels as NCCL documents them (compared without regard to case); TRACE prints only
from an NCCL built with TRACE=1."""
RCCL_DEBUG_LEVELS = ("NONE", "ERROR")
"""Levels RCCL (ROCm's NCCL) documents besides NCCL's."""


def check_nccl_debug(env: Mapping[str, str], torch: TorchFacts) -> CheckResult:
    """NCCL_DEBUG, when set, is one of NCCL's levels (RCCL's on a ROCm build)."""
    name = "nccl-debug"
    value = env.get("NCCL_DEBUG")
    if value is None:
        return not_applicable(name, "NCCL_DEBUG is unset: NCCL prints no log lines")
    levels = NCCL_DEBUG_LEVELS + (RCCL_DEBUG_LEVELS if torch.hip else ())
    if value.strip().upper() in levels:
        return ok(name, f"NCCL_DEBUG={value}: one of {'RCCL' if torch.hip else 'NCCL'}'s levels")
    return warn(
        name,
        f"NCCL_DEBUG={value!r} is not one of {'RCCL' if torch.hip else 'NCCL'}'s levels ({', '.join(levels)}): "
        "NCCL ignores it and prints nothing",
        "set NCCL_DEBUG=INFO to see NCCL's choices (transport, interfaces, rings), NCCL_DEBUG=WARN for warnings only, or unset it",
    )


def check_nccl_ib_hca(env: Mapping[str, str], ib_ports: Sequence[IbPort]) -> CheckResult:
    """NCCL_IB_HCA, when set, names RDMA devices (and ports) this node has (/sys/class/infiniband)."""
    name = "nccl-ib-hca"
    value = env.get("NCCL_IB_HCA")
    if value is None:
        return not_applicable(name, "NCCL_IB_HCA is unset: NCCL takes every RDMA device it finds")
    devices = sorted({p.device for p in ib_ports})
    listing = ", ".join(f"{p.device}:{p.port} ({p.state})" for p in ib_ports)
    unset = "or unset it (the cluster profile's env: may set it for another site's nodes)"
    if len(value.strip()) <= 1:
        return warn(
            name,
            f"NCCL_IB_HCA={value!r} is too short: NCCL ignores it",
            f"name this node's devices, e.g. NCCL_IB_HCA={devices[0] if devices else 'mlx5_0'}, {unset}",
        )
    if not devices:
        return warn(
            name,
            f"NCCL_IB_HCA={value!r} names RDMA devices, but this node has none (/sys/class/infiniband is absent or "
            "empty): NCCL finds no InfiniBand device and uses TCP sockets",
            f"run where the devices are, {unset}",
        )
    spec = parse_ifname_list(value)
    unmatched = spec.unmatched([(p.device, p.port) for p in ib_ports])
    chosen = [f"{p.device}:{p.port}" for p in ib_ports if spec.matches(p.device, p.port)]
    uses = f"NCCL uses {', '.join(chosen)}" if chosen else "NCCL finds no InfiniBand device and uses TCP sockets"
    if not spec.entries or unmatched or not chosen:
        said = (
            "names no device at all (an empty list)"
            if not spec.entries
            else f"{'excludes' if spec.exclude else 'names'} {', '.join(map(repr, unmatched))}, which "
            f"{'is' if len(unmatched) == 1 else 'are'} no device (port) of this node"
            if unmatched
            else "excludes every device of this node"
        )
        return warn(
            name,
            f"NCCL_IB_HCA={value!r} {said}; devices: {listing}: {uses}",
            f"name only this node's devices (a prefix, =name for an exact name, ^ before the list to exclude, :port "
            f"after a device), e.g. NCCL_IB_HCA={devices[0]}, {unset}",
        )
    return ok(name, f"NCCL_IB_HCA={value}: {uses}")
