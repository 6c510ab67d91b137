"""GPU checks: can this torch see the GPUs the node or the job has, what are they (memory, bf16),
and which NCCL/RCCL drives them. On a node without GPUs each says "not applicable here"."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..launch.environment import SlurmAllocation
from .probe import GpuDevice, GpuHardware, TorchFacts
from .result import CheckResult, fail, not_applicable, ok, warn
from .software import torch_install_fix

__all__ = ["check_gpu_visibility", "check_gpus", "check_nccl", "bf16_support", "has_kernels", "VISIBILITY_VARIABLES"]

VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
# Values that hide every device: empty, -1, and Slurm's "NoDevFiles" (a GPU gres without device files).
_HIDE_ALL = {"", "-1", "nodevfiles"}

# ROCm architectures with bf16 arithmetic: CDNA1 (gfx908, MI100), CDNA2 (gfx90a, MI210/MI250X),
# CDNA3/4 (gfx94x, gfx950: MI300, MI350), RDNA3/4 (gfx11xx, gfx12xx). gfx906 (MI50/MI60) and
# RDNA1/2 (gfx10xx) have none.
_ROCM_BF16_PREFIXES = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def check_gpu_visibility(
    torch: TorchFacts, hardware: GpuHardware, allocation: SlurmAllocation | None, env: Mapping[str, str]
) -> CheckResult:
    """The GPUs allocated to this process (or present on the node) must be visible to torch.

    A CPU build of torch on a GPU node, a CUDA build on a ROCm node, an empty CUDA_VISIBLE_DEVICES
    or a driver too old all end the same way without this check: the job trains on the CPU for hours.
    """
    name = "gpu-visibility"
    base, source = _gpus_granted(allocation, hardware)
    narrowed = _narrowed(env)
    if not base:
        if torch.device_count:
            return ok(name, f"torch sees {torch.device_count} GPU(s); no GPU allocation to compare with")
        return not_applicable(
            name,
            "no GPU allocated to this job (no SLURM GPU variables) and none on this node (/dev/nvidia*, /sys/class/kfd)",
        )
    expected = base
    if narrowed is not None:
        variable, count = narrowed
        if count == 0:
            return fail(
                name,
                f"{source}, but {variable} hides them all: torch {torch.version} sees {torch.device_count} GPU(s)",
                f"unset {variable} (SLURM sets it for the job) or list the GPUs to use",
            )
        expected = min(base, count)
        source = f"{source}, narrowed to {count} by {variable}={env[variable]}"
    seen = torch.device_count
    vendor = hardware.vendor
    evidence = f"{source}; torch {torch.version} ({torch.describe_build}) sees {seen}"
    if seen == 0:
        if torch.version is None:
            return fail(
                name, f"{source}; torch cannot be imported: {torch.import_error}", torch_install_fix(vendor, None)
            )
        if torch.build == "cpu":
            return fail(
                name,
                f"{evidence}: a CPU build cannot use GPUs, the job would train on the CPU",
                torch_install_fix(vendor, torch.version),
            )
        if torch.build == "cuda" and vendor == "amd":
            return fail(
                name, f"{evidence}: a CUDA build on an AMD (ROCm) node", torch_install_fix("amd", torch.version)
            )
        if torch.build == "rocm" and vendor == "nvidia":
            return fail(name, f"{evidence}: a ROCm build on an NVIDIA node", torch_install_fix("nvidia", torch.version))
        reason = torch.device_error or "no reason given"
        return fail(
            name,
            f"{evidence}: {reason}",
            "check that the driver suits this build (see torch-build), that the job asked for GPUs (--gpus-per-node) "
            "and that no *_VISIBLE_DEVICES variable hides them; in a container, run it with --nv (NVIDIA) or --rocm (AMD)",
        )
    if seen < expected:
        return warn(
            name,
            f"{evidence}, fewer than expected",
            "check CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES and the job's GPU request (--gpus-per-node, --gpus-per-task)",
        )
    if seen > expected and allocation is not None and narrowed is None:
        return warn(
            name,
            f"{evidence}, more than the job was given: processes can reach GPUs of other jobs",
            "ask for whole nodes (--exclusive) or have the site constrain devices (ConstrainDevices=yes); "
            "or set CUDA_VISIBLE_DEVICES to the job's GPUs",
        )
    return ok(name, evidence)


def check_gpus(torch: TorchFacts) -> CheckResult:
    """Each GPU's name, memory and bf16 support (decided from the architecture on ROCm); a GPU the
    CUDA build has no kernels for fails: its first operation would stop the job."""
    name = "gpus"
    if not torch.gpus:
        return not_applicable(name, "torch sees no GPU")
    lines, without, unsupported = [], [], []
    for gpu in torch.gpus:
        has, why = bf16_support(gpu, torch)
        lines.append(
            f"{gpu.index}: {gpu.name}, {gpu.memory_bytes / 2**30:.1f} GiB, {why}, bf16 {'yes' if has else 'no'}"
        )
        if not has:
            without.append(gpu)
        if has_kernels(gpu, torch) is False:
            unsupported.append(gpu)
    evidence = "; ".join(lines)
    if torch.hip:
        evidence += (
            " (on ROCm torch.version.cuda is None: a recipe that tests the CUDA version to decide bf16 "
            "turns it off wrongly; this check goes by the gfx architecture)"
        )
    if unsupported:
        gpu = unsupported[0]
        major, minor = gpu.capability or (0, 0)
        return fail(
            name,
            f"{evidence}; torch {torch.version} ({torch.describe_build}) carries kernels for {', '.join(torch.arch_list)} only, "
            f"none for compute capability {major}.{minor} ({len(unsupported)} of {len(torch.gpus)} GPU(s)): the first operation "
            "on it would stop with 'no kernel image is available for execution on the device'",
            f"run on GPUs this build has kernels for, or install a torch build whose torch.cuda.get_arch_list() holds sm_{major}{minor} "
            "(CUDA 13 builds start at 7.5; such a build may be older than the tested torch, so untested)",
        )
    if without:
        return warn(
            name,
            evidence,
            "train without bf16 on these GPUs: training.bf16=false with training.fp16=true (loss scaling) or fp32",
        )
    return ok(name, evidence)


def has_kernels(gpu: GpuDevice, torch: TorchFacts) -> bool | None:
    """Whether the CUDA build carries kernels `gpu` can run: a cubin of its major architecture and
    no newer minor (sm_80 runs on 8.6), or PTX of its capability or older (compute_90 on 10.0). None
    when unknown (a ROCm build, no architecture list, no capability)."""
    if torch.hip or not torch.arch_list or gpu.capability is None:
        return None
    for arch in torch.arch_list:
        kind, _, number = arch.partition("_")
        digits = re.match(r"\d+", number)
        if digits is None:
            continue
        major, minor = divmod(int(digits.group()), 10)  # sm_75 -> 7.5, sm_100 -> 10.0, sm_90a -> 9.0
        if kind == "sm" and major == gpu.capability[0] and minor <= gpu.capability[1]:
            return True
        if kind == "compute" and (major, minor) <= gpu.capability:
            return True
    return False


def bf16_support(gpu: GpuDevice, torch: TorchFacts) -> tuple[bool, str]:
    """(bf16 arithmetic in hardware, what decided it)."""
    if torch.hip:
        arch = (gpu.arch or "").split(":", 1)[0]
        if not arch:
            return False, "unknown gfx architecture"
        return arch.startswith(_ROCM_BF16_PREFIXES), arch
    if gpu.capability is None:
        return False, "unknown compute capability"
    major, minor = gpu.capability
    # bf16 tensor cores came with Ampere (8.0). torch.cuda.is_bf16_supported() also says yes on
    # older GPUs, where it is emulated and slower than fp32.
    return major >= 8, f"compute capability {major}.{minor}"


def check_nccl(torch: TorchFacts, env: Mapping[str, str]) -> CheckResult:
    """The NCCL (RCCL on ROCm) that torch uses, and settings in the environment that slow it down."""
    name = "nccl"
    if not torch.device_count:
        return not_applicable(name, "torch sees no GPU; collectives run on gloo (NCCL/RCCL serve GPUs)")
    library = "RCCL" if torch.hip else "NCCL"
    if not torch.nccl:
        return fail(
            name,
            f"torch {torch.version} was built without {library}: GPUs cannot communicate",
            "install an official torch wheel for this GPU (they include NCCL/RCCL)",
        )
    settings = sorted(f"{k}={v}" for k, v in env.items() if k.startswith(("NCCL_", "RCCL_")))
    evidence = f"{library} {torch.nccl_version or '(version not reported)'}; " + (
        f"settings: {', '.join(settings)}" if settings else "no NCCL_* settings"
    )
    slow = [k for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") if env.get(k, "0") not in ("0", "")]
    if slow:
        return warn(
            name,
            f"{evidence}; {' and '.join(slow)} make the GPUs of a node exchange data through slower paths",
            f"unset {' and '.join(slow)} unless the site's documentation asks for it",
        )
    return ok(name, evidence)


def _gpus_granted(allocation: SlurmAllocation | None, hardware: GpuHardware) -> tuple[int, str]:
    if allocation is not None and allocation.gpus_on_node:
        shown = ", ".join(f"{k}={v}" for k, v in allocation.gpu_variables) or f"{allocation.gpus_on_node} GPU(s)"
        return (
            allocation.gpus_on_node,
            f"job {allocation.job_id} has {allocation.gpus_on_node} GPU(s) on this node ({shown})",
        )
    if hardware.count:
        where = (
            f"{hardware.nvidia_devices[0]}..{hardware.nvidia_devices[-1]}"
            if hardware.nvidia_devices
            else "/sys/class/kfd"
        )
        vendor = {"nvidia": "NVIDIA", "amd": "AMD"}[hardware.vendor or "nvidia"]
        return hardware.count, f"this node has {hardware.count} {vendor} GPU(s) ({where})"
    return 0, ""


def _narrowed(env: Mapping[str, str]) -> tuple[str, int] | None:
    for variable in VISIBILITY_VARIABLES:
        if variable in env:
            value = env[variable].strip()
            if value.lower() in _HIDE_ALL:
                return variable, 0
            return variable, len([v for v in value.split(",") if v.strip()])
    return None
