"""Network checks: which interfaces NCCL and gloo will use, and whether NCCL gets the fast fabric
(InfiniBand, or Slingshot through its plugin) or falls back to TCP sockets without saying so.

NCCL_SOCKET_IFNAME (and NCCL_IB_HCA for RDMA devices) is a comma list read the way NCCL reads
it: each entry is a name prefix ("eth" matches eth0 and eth1); a leading "^" inverts the whole list
(use every interface that matches none of them); a leading "=" (after "^" if both) makes every
entry an exact name; an entry may end in ":port" (only for NCCL_IB_HCA ports). NCCL ignores a
value of one character. Unset, NCCL takes ib* interfaces, else any but docker*/lo/virbr*, else
docker*, else lo. NCCL only uses interfaces that have an IPv4 or non-link-local IPv6 address.
GLOO_SOCKET_IFNAME is simpler: exact names, comma separated; unset, gloo binds to the address the
host name resolves to, and to loopback when it does not resolve.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .probe import IbPort, NetInterface, TorchFacts
from .result import CheckResult, fail, not_applicable, ok, warn

__all__ = [
    "IfnameList",
    "parse_ifname_list",
    "nccl_socket_interfaces",
    "check_nccl_socket_ifname",
    "check_gloo_socket_ifname",
    "check_fabric",
    "find_net_plugins",
]

# NCCL's own fallback order when NCCL_SOCKET_IFNAME is unset.
_NCCL_DEFAULT_ORDER = ("ib", "^docker,lo,virbr", "docker", "lo")


@dataclass(frozen=True)
class IfnameList:
    """A parsed NCCL interface list."""

    entries: tuple[tuple[str, int | None], ...]
    """(name or prefix, port or None)."""
    exclude: bool = False
    exact: bool = False

    def matches(self, name: str, port: int | None = None) -> bool:
        # An empty list matches everything, so "^" alone excludes everything (as in NCCL).
        hit = not self.entries or any(self._names(entry, name, port) for entry in self.entries)
        return hit != self.exclude

    def unmatched(self, found: Sequence[tuple[str, int | None]]) -> list[str]:
        """The entries (as written) that name nothing in `found`, (name, port) pairs of this node: a
        typo, or a name from another site. Such an entry selects nothing and excludes nothing."""
        return [
            f"{entry[0]}:{entry[1]}" if entry[1] is not None else entry[0]
            for entry in self.entries
            if not any(self._names(entry, name, port) for name, port in found)
        ]

    def _names(self, entry: tuple[str, int | None], name: str, port: int | None) -> bool:
        prefix, wanted_port = entry
        named = name == prefix if self.exact else name.startswith(prefix)
        return named and (wanted_port is None or port is None or wanted_port == port)


def parse_ifname_list(value: str) -> IfnameList:
    """NCCL's reading of NCCL_SOCKET_IFNAME / NCCL_IB_HCA (see the module docstring)."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        entry, _, port = item.partition(":")
        if entry:
            entries.append((entry, int(port) if port.isdigit() else None))
    return IfnameList(tuple(entries), exclude, exact)


def nccl_socket_interfaces(value: str | None, interfaces: Sequence[NetInterface]) -> list[NetInterface]:
    """The interfaces NCCL's socket transport and bootstrap would use (those with an address)."""
    usable = [i for i in interfaces if i.addresses]
    if value is not None and len(value.strip()) > 1:
        spec = parse_ifname_list(value)
        return [i for i in usable if spec.matches(i.name)]
    for fallback in _NCCL_DEFAULT_ORDER:
        spec = parse_ifname_list(fallback)
        picked = [i for i in usable if spec.matches(i.name)]
        if picked:
            return picked
    return []


def check_nccl_socket_ifname(
    env: Mapping[str, str], interfaces: Sequence[NetInterface], num_nodes: int, nccl_used: bool
) -> CheckResult:
    """NCCL_SOCKET_IFNAME must name interfaces this node has; one that matches nothing stops NCCL at
    initialisation (or hangs it), and loopback alone cannot reach other nodes."""
    name = "nccl-socket-ifname"
    value = env.get("NCCL_SOCKET_IFNAME")
    listing = _listing(interfaces)
    if value is None and not nccl_used:
        return not_applicable(name, "NCCL_SOCKET_IFNAME is unset and NCCL is not used (no GPU visible to torch)")
    picked = nccl_socket_interfaces(value, interfaces)
    shown = ", ".join(_describe(i) for i in picked)
    severity = fail if nccl_used else warn
    unused_note = (
        "" if nccl_used else " (NCCL is not used on this node, but GPU nodes with the same interfaces would fail)"
    )
    if value is not None and len(value.strip()) <= 1:
        return warn(
            name,
            f"NCCL_SOCKET_IFNAME={value!r} is too short: NCCL ignores it and picks {shown or 'nothing'}",
            f"give interface names or prefixes, e.g. NCCL_SOCKET_IFNAME={_suggest(interfaces)}",
        )
    if not picked:
        if value is None:
            return severity(
                name,
                f"this node has no interface with an address for NCCL; interfaces: {listing}{unused_note}",
                "check the node's network configuration",
            )
        spec = parse_ifname_list(value)
        without_address = [i.name for i in interfaces if not i.addresses and spec.matches(i.name)]
        why = f"; {', '.join(without_address)} match but have no IP address" if without_address else ""
        return severity(
            name,
            f"NCCL_SOCKET_IFNAME={value} matches no usable interface{why}; interfaces: {listing}: NCCL stops at "
            f"initialisation ('no socket interface found') or waits until the timeout{unused_note}",
            f"set NCCL_SOCKET_IFNAME to a prefix or =name of this node's interfaces, e.g. NCCL_SOCKET_IFNAME={_suggest(interfaces)}, "
            "or unset it (the cluster profile's env: may set it for another site)",
        )
    only_loopback = all(i.kind == "loopback" or i.name == "lo" for i in picked)
    source = (
        f"NCCL_SOCKET_IFNAME={value}"
        if value is not None
        else "NCCL_SOCKET_IFNAME unset (NCCL's default order: ib*, any but docker*/lo/virbr*, docker*, lo)"
    )
    if only_loopback and num_nodes > 1:
        return severity(
            name,
            f"{source} selects only loopback ({shown}) in a job of {num_nodes} nodes: other nodes cannot connect{unused_note}",
            f"name the interface that links the nodes, e.g. NCCL_SOCKET_IFNAME={_suggest(interfaces)}",
        )
    if value is not None:
        spec = parse_ifname_list(value)
        unmatched = spec.unmatched([(i.name, None) for i in interfaces])
        if not spec.entries or unmatched:
            said = (
                "names no interface at all (an empty list)"
                if not spec.entries
                else f"{'excludes' if spec.exclude else 'names'} {', '.join(map(repr, unmatched))}, which "
                f"{'is' if len(unmatched) == 1 else 'are'} no interface of this node (a typo, or another site's name)"
            )
            return warn(
                name,
                f"NCCL_SOCKET_IFNAME={value!r} {said}; interfaces: {listing}: NCCL uses {shown}",
                f"name only this node's interfaces (a prefix, =name for an exact name, ^ before the list to exclude), "
                f"e.g. NCCL_SOCKET_IFNAME={_suggest(interfaces)} or NCCL_SOCKET_IFNAME=^docker,lo, or unset it",
            )
    return ok(name, f"{source}: NCCL uses {shown}")


def check_gloo_socket_ifname(
    env: Mapping[str, str],
    interfaces: Sequence[NetInterface],
    hostname: str,
    resolve: Callable[[str], list[str]],
    num_nodes: int,
) -> CheckResult:
    """GLOO_SOCKET_IFNAME must list existing interfaces with an address; unset, the host name must
    resolve to an address other nodes can reach (gloo binds to loopback otherwise)."""
    name = "gloo-socket-ifname"
    value = env.get("GLOO_SOCKET_IFNAME")
    by_name = {i.name: i for i in interfaces}
    if value is not None and value.strip():
        wanted = [v.strip() for v in value.split(",") if v.strip()]
        missing = [w for w in wanted if w not in by_name]
        bare = [w for w in wanted if w in by_name and not by_name[w].addresses]
        if missing or bare:
            problems = ([f"no interface {', '.join(missing)}"] if missing else []) + (
                [f"{', '.join(bare)} has no IP address"] if bare else []
            )
            return fail(
                name,
                f"GLOO_SOCKET_IFNAME={value}: {'; '.join(problems)} (gloo takes exact names, not prefixes); interfaces: {_listing(interfaces)}: "
                "creating the process group fails ('Unable to find address for ...')",
                f"set GLOO_SOCKET_IFNAME to exact names of this node, e.g. GLOO_SOCKET_IFNAME={_suggest(interfaces)}",
            )
        if num_nodes > 1 and all(by_name[w].kind == "loopback" for w in wanted):
            return fail(
                name,
                f"GLOO_SOCKET_IFNAME={value} is loopback in a job of {num_nodes} nodes",
                f"use the interface that links the nodes, e.g. GLOO_SOCKET_IFNAME={_suggest(interfaces)}",
            )
        return ok(name, f"GLOO_SOCKET_IFNAME={value}: gloo uses {', '.join(_describe(by_name[w]) for w in wanted)}")
    try:
        addresses = resolve(hostname)
    except OSError as exc:
        addresses, error = [], str(exc)
    else:
        error = ""
    loopback = bool(addresses) and all(a.startswith("127.") or a == "::1" for a in addresses)
    if addresses and not loopback:
        return ok(
            name,
            f"GLOO_SOCKET_IFNAME unset: gloo binds to the address of host name {hostname} ({', '.join(addresses)})",
        )
    found = f"resolves to {', '.join(addresses)}" if addresses else f"does not resolve ({error or 'no address'})"
    evidence = f"GLOO_SOCKET_IFNAME unset and host name {hostname} {found}: gloo binds to loopback"
    fix = (
        f"set GLOO_SOCKET_IFNAME to the interface that links the nodes, e.g. GLOO_SOCKET_IFNAME={_suggest(interfaces)}"
    )
    if num_nodes > 1:
        return fail(name, f"{evidence} in a job of {num_nodes} nodes: the other nodes cannot connect", fix)
    return ok(name, f"{evidence} (enough on one node; with several nodes: {fix})")


def check_fabric(
    ib_ports: Sequence[IbPort],
    cxi_devices: Sequence[str],
    interfaces: Sequence[NetInterface],
    env: Mapping[str, str],
    plugins: Sequence[str],
    torch: TorchFacts,
) -> CheckResult:
    """Whether NCCL/RCCL gets the node's fast network: active InfiniBand ports that NCCL_IB_HCA and
    NCCL_IB_DISABLE leave to it, or on Slingshot the OFI plugin; otherwise it uses TCP sockets."""
    name = "fabric"
    found = _fabric_listing(ib_ports, cxi_devices)
    if not torch.device_count:
        return not_applicable(name, f"torch sees no GPU, so collectives run on gloo over TCP ({found})")
    if ib_ports:
        active = [p for p in ib_ports if p.state == "ACTIVE"]
        if not active:
            return warn(
                name,
                f"RDMA devices but no ACTIVE port ({found}): NCCL falls back to TCP sockets",
                "ask the site: the ports are down (cable, subnet manager) on this node",
            )
        if env.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
            return warn(
                name,
                f"{found}; NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} makes NCCL use TCP sockets instead",
                "unset NCCL_IB_DISABLE",
            )
        hca = env.get("NCCL_IB_HCA")
        if hca:
            spec = parse_ifname_list(hca)
            chosen = [p for p in active if spec.matches(p.device, p.port)]
            if not chosen:
                return fail(
                    name,
                    f"NCCL_IB_HCA={hca} matches no ACTIVE port ({found}): NCCL cannot use InfiniBand",
                    f"set NCCL_IB_HCA to these devices (e.g. NCCL_IB_HCA={active[0].device}) or unset it",
                )
            active = chosen
        return ok(name, f"NCCL can use RDMA: {', '.join(_port(p) for p in active)}")
    if cxi_devices:
        if plugins:
            return ok(name, f"Slingshot ({', '.join(cxi_devices)}) with the network plugin {', '.join(plugins)}")
        return warn(
            name,
            f"Slingshot NICs ({', '.join(cxi_devices)}) but no NCCL/RCCL network plugin (lib*ccl-net*.so) on LD_LIBRARY_PATH: "
            "NCCL/RCCL falls back to TCP sockets, many times slower",
            "run in a container that bundles the aws-ofi-nccl / aws-ofi-rccl plugin (on LUMI, the images under "
            "/appl/local/containers/sif-images/), or add the plugin's directory to LD_LIBRARY_PATH",
        )
    socket_ifs = nccl_socket_interfaces(env.get("NCCL_SOCKET_IFNAME"), interfaces)
    return ok(
        name,
        f"no InfiniBand or Slingshot device: between nodes NCCL uses TCP over {', '.join(i.name for i in socket_ifs) or 'no interface'} (doctor --comm measures it)",
    )


def find_net_plugins(
    env: Mapping[str, str], extra_dirs: Sequence[str] = ("/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib")
) -> list[str]:
    """NCCL/RCCL network plugins (libnccl-net*.so, librccl-net*.so) NCCL could load: NCCL_NET_PLUGIN
    when it names a file, else the library search path."""
    named = env.get("NCCL_NET_PLUGIN", "")
    if named and os.path.isfile(named):
        return [named]
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(extra_dirs)
    found: list[str] = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "lib*ccl-net*.so*"))):
            if path not in found:
                found.append(path)
    return found


def _describe(interface: NetInterface) -> str:
    return f"{interface.name} ({', '.join(interface.addresses)})" if interface.addresses else interface.name


def _listing(interfaces: Sequence[NetInterface]) -> str:
    return ", ".join(f"{i.name}{'' if i.addresses else ' (no address)'}" for i in interfaces) or "none"


def _suggest(interfaces: Sequence[NetInterface]) -> str:
    """The first interface NCCL would pick by itself (loopback aside), as an example value."""
    picked = [i for i in nccl_socket_interfaces(None, interfaces) if i.kind != "loopback" and i.name != "lo"]
    return picked[0].name if picked else "lo"


def _port(p: IbPort) -> str:
    rate = f", {p.rate}" if p.rate else ""
    return f"{p.device} port {p.port} {p.state} ({p.link_layer}{rate})"


def _fabric_listing(ib_ports: Sequence[IbPort], cxi_devices: Sequence[str]) -> str:
    parts = [_port(p) for p in ib_ports] + [f"Slingshot {d}" for d in cxi_devices]
    return "; ".join(parts) if parts else "no InfiniBand or Slingshot device"
