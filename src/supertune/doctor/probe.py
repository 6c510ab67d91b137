"""Reading this node: network interfaces, InfiniBand ports, GPU device files and drivers, torch's
build and devices, installed package versions. The checks never read the machine themselves; they
take what these functions return (or what a test crafts), so every verdict can be tested anywhere.

Costs: importing torch (about 1 s) and, on a GPU node, initialising the CUDA/ROCm runtime to read
the device properties (no memory is allocated on the GPUs). Everything else is a few small files.
"""

from __future__ import annotations

import fcntl
import re
import socket
import struct
import warnings
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

__all__ = [
    "NetInterface",
    "IbPort",
    "GpuHardware",
    "GpuDevice",
    "TorchFacts",
    "read_interfaces",
    "read_ib_ports",
    "read_cxi_devices",
    "read_gpu_hardware",
    "read_torch",
    "package_versions",
    "pinned_versions",
    "resolve_host",
]

_LINK_TYPES = {"1": "ethernet", "32": "infiniband", "772": "loopback"}


@dataclass(frozen=True)
class NetInterface:
    """One network interface of the node."""

    name: str
    addresses: tuple[str, ...] = ()
    """IPv4 and global IPv6 addresses; NCCL and gloo only use interfaces that have one."""
    kind: str = "ethernet"
    """ethernet, infiniband (IPoIB), loopback, or "type N" (the kernel's ARPHRD number)."""
    state: str = "unknown"
    """The kernel's operstate: up, down, unknown (loopback and many virtual links say unknown)."""


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device (InfiniBand, or RoCE when link_layer is Ethernet)."""

    device: str
    port: int
    state: str
    """ACTIVE, DOWN, INIT, ARMED, ..."""
    link_layer: str = "InfiniBand"
    rate: str = ""


@dataclass(frozen=True)
class GpuHardware:
    """The GPUs a node has, as the kernel shows them, whatever the installed torch can use."""

    nvidia_devices: tuple[str, ...] = ()
    """/dev/nvidia0, /dev/nvidia1, ... (present on NVIDIA nodes, and in containers run with --nv)."""
    nvidia_driver: str | None = None
    amd_gpus: int = 0
    """GPU nodes in the KFD topology (/sys/class/kfd): the GPUs ROCm can use."""
    amd_driver: str | None = None

    @property
    def vendor(self) -> str | None:
        if self.nvidia_devices or self.nvidia_driver:
            return "nvidia"
        if self.amd_gpus or self.amd_driver:
            return "amd"
        return None

    @property
    def count(self) -> int:
        return len(self.nvidia_devices) or self.amd_gpus


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as torch sees it."""

    index: int
    name: str
    memory_bytes: int
    capability: tuple[int, int] | None = None
    """CUDA compute capability (ROCm builds report the gfx major/minor here too)."""
    arch: str | None = None
    """ROCm only: the gfx architecture (gcnArchName, e.g. "gfx90a:sramecc+:xnack-")."""


@dataclass(frozen=True)
class TorchFacts:
    """The installed torch: its build, what it sees, and its distributed backends."""

    version: str | None
    """None when torch cannot be imported (see import_error)."""
    cuda: str | None = None
    """CUDA version of a CUDA build (torch.version.cuda); None for CPU and ROCm builds."""
    hip: str | None = None
    """HIP version of a ROCm build (torch.version.hip)."""
    device_count: int = 0
    device_error: str | None = None
    """Why torch sees no GPU, as torch said it (a driver too old, no device found, ...)."""
    gpus: tuple[GpuDevice, ...] = ()
    distributed: bool = True
    gloo: bool = True
    nccl: bool = False
    nccl_version: str | None = None
    import_error: str | None = None
    arch_list: tuple[str, ...] = ()
    """torch.cuda.get_arch_list() of a CUDA build that sees GPUs: the architectures it carries kernels
    for (sm_80: compiled for 8.x; compute_90: PTX, compiled on the device for 9.0 and newer); empty
    when unknown."""

    @property
    def build(self) -> str:
        """cuda, rocm or cpu."""
        return "rocm" if self.hip else "cuda" if self.cuda else "cpu"

    @property
    def describe_build(self) -> str:
        if self.hip:
            return f"ROCm {self.hip} build"
        if self.cuda:
            return f"CUDA {self.cuda} build"
        return "CPU build"


def read_interfaces(
    sys_net: Path = Path("/sys/class/net"), proc_inet6: Path = Path("/proc/net/if_inet6")
) -> list[NetInterface]:
    """The node's network interfaces with their addresses, kind and state."""
    try:
        names = sorted(p.name for p in sys_net.iterdir())
    except OSError:
        names = sorted(name for _, name in socket.if_nameindex())
    ipv6 = _global_ipv6(proc_inet6)
    found = []
    for name in names:
        link_type = _read(sys_net / name / "type") or "?"
        v4 = _ipv4_address(name)
        found.append(
            NetInterface(
                name=name,
                addresses=tuple(([v4] if v4 else []) + ipv6.get(name, [])),
                kind=_LINK_TYPES.get(link_type, f"type {link_type}"),
                state=_read(sys_net / name / "operstate") or "unknown",
            )
        )
    return found


def _ipv4_address(name: str) -> str | None:
    # SIOCGIFADDR: the interface's (first) IPv4 address; the socket module has no getifaddrs.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _global_ipv6(proc_inet6: Path) -> dict[str, list[str]]:
    # Lines: address (32 hex digits), index, prefix length, scope, flags, name. NCCL skips
    # link-local addresses (scope 0x20); loopback's ::1 has scope 0x10.
    found: dict[str, list[str]] = {}
    for line in (_read(proc_inet6) or "").splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[3] in ("00", "10"):
            hexaddr = parts[0]
            address = ":".join(hexaddr[i : i + 4] for i in range(0, 32, 4))
            found.setdefault(parts[5], []).append(
                socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address))
            )
    return found


def read_ib_ports(sys_ib: Path = Path("/sys/class/infiniband")) -> list[IbPort]:
    """Ports of the node's RDMA devices (mlx5_0/1, ...); empty without InfiniBand or RoCE."""
    ports = []
    for device in sorted(sys_ib.glob("*")):
        for port_dir in sorted((device / "ports").glob("*")):
            state = _read(port_dir / "state") or "unknown"
            ports.append(
                IbPort(
                    device=device.name,
                    port=int(port_dir.name) if port_dir.name.isdigit() else 0,
                    state=state.split(":", 1)[-1].strip(),  # "4: ACTIVE"
                    link_layer=_read(port_dir / "link_layer") or "InfiniBand",
                    rate=_read(port_dir / "rate") or "",
                )
            )
    return ports


def read_cxi_devices(sys_cxi: Path = Path("/sys/class/cxi")) -> list[str]:
    """HPE Slingshot NICs (cxi0, cxi1, ...): present on LUMI, Setonix and other Cray EX systems."""
    return sorted(p.name for p in sys_cxi.glob("cxi*"))


def read_gpu_hardware(dev: Path = Path("/dev"), proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> GpuHardware:
    """NVIDIA device files and driver, AMD GPUs of the KFD topology and the amdgpu driver."""
    nvidia = tuple(sorted((str(p) for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)), key=_natural))
    version_text = _read(proc / "driver" / "nvidia" / "version") or ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", version_text)
    amd = 0
    for node in (sys / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*"):
        gpu_id = _read(node / "gpu_id")
        if gpu_id and gpu_id != "0":
            amd += 1
    amd_module = sys / "module" / "amdgpu"
    return GpuHardware(
        nvidia_devices=nvidia,
        nvidia_driver=match.group(1) if match else None,
        amd_gpus=amd,
        amd_driver=(_read(amd_module / "version") or "loaded") if amd_module.exists() else None,
    )


def read_torch() -> TorchFacts:
    """torch's build, GPUs and backends; never raises (an import failure is a fact too)."""
    try:
        import torch
    except Exception as exc:  # a broken install raises anything from ImportError to OSError
        return TorchFacts(version=None, import_error=f"{type(exc).__name__}: {exc}")
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    count, error, gpus, arch_list = 0, None, [], ()
    if cuda or hip:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
        if available:
            count = torch.cuda.device_count()
            arch_list = tuple(torch.cuda.get_arch_list()) if cuda else ()
            for index in range(count):
                props = torch.cuda.get_device_properties(index)
                gpus.append(
                    GpuDevice(
                        index=index,
                        name=props.name,
                        memory_bytes=int(props.total_memory),
                        capability=(props.major, props.minor),
                        arch=getattr(props, "gcnArchName", None) if hip else None,
                    )
                )
        else:
            error = "; ".join(str(w.message).strip() for w in caught) or "torch.cuda.is_available() is False"
    dist = torch.distributed
    available = dist.is_available()
    nccl = bool(available and dist.is_nccl_available())
    nccl_version = None
    if nccl and count:
        try:
            nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # some builds link NCCL statically and cannot say
            nccl_version = None
    return TorchFacts(
        version=torch.__version__,
        cuda=cuda,
        hip=hip,
        device_count=count,
        device_error=error,
        gpus=tuple(gpus),
        distributed=available,
        gloo=bool(available and dist.is_gloo_available()),
        nccl=nccl,
        nccl_version=nccl_version,
        arch_list=arch_list,
    )


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions (None: not installed), read from the package metadata without importing."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def pinned_versions() -> dict[str, str]:
    """The versions supertune is tested with (src/supertune/pinned-requirements.txt)."""
    text = resources.files("supertune").joinpath("pinned-requirements.txt").read_text()
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def resolve_host(name: str) -> list[str]:
    """The addresses `name` resolves to (raises OSError when it does not)."""
    return sorted({info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _natural(text: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", text)
    return (int(digits[-1]) if digits else -1, text)
