"""Checks of the Python environment: interpreter, package versions against the pins, torch's build
against the node's GPU driver."""

from __future__ import annotations

from collections.abc import Mapping

from .probe import GpuHardware, TorchFacts
from .result import CheckResult, fail, ok, warn

__all__ = ["check_python", "check_packages", "check_torch_build", "REPORTED_PACKAGES", "torch_install_fix"]

REPORTED_PACKAGES = ("torch", "transformers", "accelerate", "peft", "deepspeed")
_OPTIONAL = {"deepspeed": "needed only by distributed.strategy zero1/zero2/zero3"}

# The oldest NVIDIA driver branch of each CUDA major release ("minor version compatibility":
# NVIDIA's CUDA Compatibility guide, table "CUDA Toolkit 11.x, 12.x and 13.x Minimum Required
# Driver Versions"). A torch built for CUDA 12.8 runs on any 525+ driver; an older driver makes
# torch.cuda.is_available() False with a warning that only a log shows.
MIN_DRIVER_BRANCH = {11: 450, 12: 525, 13: 580}


def check_python(version: tuple[int, int, int], executable: str) -> CheckResult:
    """supertune needs Python 3.11 or newer."""
    text = ".".join(str(v) for v in version)
    if version[:2] < (3, 11):
        return fail(
            "python",
            f"Python {text} ({executable})",
            "supertune needs Python 3.11 or newer: PYTHON=python3.11 bash scripts/env.sh",
        )
    return ok("python", f"Python {text} ({executable})")


def check_packages(installed: Mapping[str, str | None], pins: Mapping[str, str]) -> CheckResult:
    """Versions of the packages that train; missing required ones fail, other versions than the pins warn."""
    missing, differ, shown = [], [], []
    for name in REPORTED_PACKAGES:
        version = installed.get(name)
        if version is None:
            if name in _OPTIONAL:
                shown.append(f"{name} not installed ({_OPTIONAL[name]})")
            else:
                missing.append(name)
            continue
        shown.append(f"{name} {version}")
        pin = pins.get(name)
        # A local version label names the build (2.13.0+cu128), not another release.
        if pin and version.split("+", 1)[0] != pin:
            differ.append(f"{name} {version} (tested: {pin})")
    evidence = ", ".join(shown)
    if missing:
        return fail(
            "packages",
            f"not installed: {', '.join(missing)}; {evidence}",
            "install the tested versions: pip install -r src/supertune/pinned-requirements.txt (bash scripts/env.sh does it)",
        )
    if differ:
        return warn(
            "packages",
            f"{evidence}; other versions than supertune is tested with: {', '.join(differ)}",
            "pip install "
            + " ".join(f"'{d.split()[0]}=={pins[d.split()[0]]}'" for d in differ)
            + " (or keep them, knowing they are untested)",
        )
    return ok("packages", f"{evidence} (the tested versions)")


def check_torch_build(torch: TorchFacts, hardware: GpuHardware) -> CheckResult:
    """torch imports, has torch.distributed, and a CUDA build's CUDA release suits the NVIDIA driver."""
    driver = _driver_text(hardware)
    if torch.version is None:
        return fail(
            "torch-build",
            f"torch cannot be imported: {torch.import_error}",
            "reinstall it: bash scripts/env.sh (or pip install -r src/supertune/pinned-requirements.txt)",
        )
    evidence = f"torch {torch.version}: {torch.describe_build}; {driver}"
    if not torch.distributed:
        return fail(
            "torch-build",
            f"{evidence}; torch.distributed is not available in this build",
            "install an official torch wheel (they all include torch.distributed)",
        )
    if torch.cuda and hardware.nvidia_driver:
        cuda_major = int(torch.cuda.split(".")[0])
        branch = int(hardware.nvidia_driver.split(".")[0])
        needed = MIN_DRIVER_BRANCH.get(cuda_major)
        if needed is not None and branch < needed:
            return fail(
                "torch-build",
                f"{evidence}; CUDA {cuda_major}.x needs an NVIDIA driver {needed} or newer",
                f"use a torch build for an older CUDA release that driver {hardware.nvidia_driver} supports "
                f"({_older_cuda_hint(branch)}), or ask the site for a newer driver",
            )
    return ok("torch-build", evidence)


def torch_install_fix(vendor: str | None, version: str | None) -> str:
    """How to install the torch build that matches the node's GPUs, at the tested version."""
    pin = f"torch=={version.split('+', 1)[0]}" if version else "torch"
    container = "or run in the site's container (supertune container --cluster NAME)"
    if vendor == "amd":
        return (
            f"install a ROCm build: SUPERTUNE_TORCH=rocm6.4 bash scripts/env.sh (pip install '{pin}' "
            f"--index-url https://download.pytorch.org/whl/rocm6.4; a ROCm release the node's driver supports), {container}"
        )
    if vendor == "nvidia":
        return (
            "install the CUDA build the node's driver runs: SUPERTUNE_TORCH=auto bash scripts/env.sh on this node picks it "
            f"(cu130, PyPI's own '{pin}', for driver {MIN_DRIVER_BRANCH[13]}+; cu128 from https://download.pytorch.org/whl/cu128 "
            f"for {MIN_DRIVER_BRANCH[12]}+), {container}"
        )
    return (
        "install the build for the node's GPUs: SUPERTUNE_TORCH=auto bash scripts/env.sh on a compute node picks it "
        f"(cu130 or cu128 by the NVIDIA driver, rocm6.4 on AMD; 'SUPERTUNE_TORCH=... bash scripts/env.sh --print' shows the pip commands), {container}"
    )


def _driver_text(hardware: GpuHardware) -> str:
    if hardware.nvidia_driver:
        return f"NVIDIA driver {hardware.nvidia_driver}"
    if hardware.amd_driver:
        return "amdgpu driver " + ("loaded" if hardware.amd_driver == "loaded" else hardware.amd_driver)
    return "no GPU driver loaded"


def _older_cuda_hint(branch: int) -> str:
    usable = [major for major, least in sorted(MIN_DRIVER_BRANCH.items()) if branch >= least]
    if not usable:
        return "none: this driver is older than CUDA 11's"
    return f"CUDA {usable[-1]}.x, e.g. cu118" if usable[-1] == 11 else f"CUDA {usable[-1]}.x, e.g. cu126"
