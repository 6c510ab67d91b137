"""What would make a job fail only after it waited in the queue, checked before `sbatch`: a PyTorch
build that cannot use the profile's GPUs, and a profile's placeholder values (an account or project
path that stands for the user's own, module names shipped as unchecked examples). A real submission refuses them; a dry run shows them as
warnings, since it submits nothing.

The torch build is read from the installed distribution's metadata (its version's local label and
its requirements), not by importing torch: this runs on login nodes, in about a millisecond.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import metadata
from typing import Any

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig

__all__ = ["installed_torch_build", "placeholder_problems", "submit_problems"]


def installed_torch_build() -> tuple[str | None, str]:
    """(version, build) of the torch this Python would import: build is cpu, cuda, rocm or none (not installed).

    A local version label names the build (2.13.0+cpu, +cu128, +rocm6.4); PyPI's unlabelled wheel is
    the CUDA build where its requirements name NVIDIA's CUDA packages (x86_64) and a CPU build elsewhere."""
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None, "none"
    version = dist.version
    label = version.partition("+")[2].lower()
    if label.startswith("cu"):
        return version, "cuda"
    if label.startswith("rocm"):
        return version, "rocm"
    if label:
        return version, "cpu"
    requires = " ".join(dist.requires or []).lower()
    return version, "cuda" if ("nvidia-" in requires or "cuda" in requires) else "cpu"


def submit_problems(cfg: RunConfig, profile: ClusterProfile) -> list[str]:
    """Problems that would stop the job only once it starts; one line each, naming the fix."""
    return _torch_problems(cfg, profile) + placeholder_problems(cfg, profile)


def _torch_problems(cfg: RunConfig, profile: ClusterProfile) -> list[str]:
    from ..doctor.software import torch_install_fix

    gpus = cfg.launch.gpus_per_node if cfg.launch.gpus_per_node is not None else profile.gpus_per_node
    if gpus <= 0 or profile.gpu_vendor not in ("nvidia", "amd"):
        return []
    if profile.container.runtime != "none" and profile.container.image:
        return []  # the job runs the image's own torch
    version, build = installed_torch_build()
    wanted = {"nvidia": "cuda", "amd": "rocm"}[profile.gpu_vendor]
    if build == wanted:
        return []
    have = "no torch is installed" if build == "none" else f"its torch {version} is a {build.upper()} build"
    return [
        f"launch.cluster {profile.name}: the job runs this Python ({_python()}), and {have}, which cannot use the "
        f"nodes' {profile.gpu_vendor.upper()} GPUs: the job would wait in the queue and then stop; "
        f"{torch_install_fix(profile.gpu_vendor, version)}"
    ]


def _python() -> str:
    import sys

    return sys.executable


def placeholder_problems(cfg: RunConfig, profile: ClusterProfile) -> list[str]:
    from ..clusters.registry import user_profile_dir

    target = user_profile_dir() / f"{profile.name}.yaml"
    problems = []
    marks = [m for m in profile.placeholders if m]
    for key, value in _strings(dataclasses.asdict(profile)) if marks else []:
        if re.split(r"[.\[]", key)[0] in ("placeholders", "placeholder_keys", "description", "name", "notes"):
            continue
        if key == "account" and cfg.slurm.account:
            continue  # slurm.account of the run is used instead
        found = next((m for m in marks if m.lower() in value.lower()), None)
        if found:
            extra = " (or give slurm.account)" if key == "account" else ""
            problems.append(
                f"launch.cluster {profile.name}: {key} is {value!r}, which holds the shipped placeholder {found!r}; "
                f"write your own value of {key} in {target}, which overrides the shipped profile{extra}"
            )
    for key in profile.placeholder_keys:  # registry.py drops the keys the user's file sets
        value = getattr(profile, key, None)
        if value:
            hint = " (see `module avail` there)" if key in ("modules", "module_use") else ""
            problems.append(
                f"launch.cluster {profile.name}: {key} {value!r} are the shipped profile's examples, not checked on "
                f"{profile.name} (marked CHECK); write the site's own {key}{hint} in {target}, which overrides the "
                "shipped profile (the same value written there confirms it)"
            )
    return problems


def _strings(value: Any, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) of every string in a profile's data."""
    if isinstance(value, str):
        return [(key, value)]
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _strings(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, list):
        return [pair for i, v in enumerate(value) for pair in _strings(v, f"{key}[{i}]")]
    return []
