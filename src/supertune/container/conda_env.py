"""A conda environment file with supertune's tested pins, for cotainr (or conda/mamba).

Unlike the Apptainer definition, this environment brings its own Python and torch: a pip wheel
of torch carries its CUDA or ROCm libraries, so the base image needs no PyTorch. For AMD sites
the profile names the ROCm wheel index (container.torch_index_url).
"""

from __future__ import annotations

import re

from .. import __version__
from ..clusters.schema import ClusterProfile
from .pins import Pin
from .source import SupertuneSource

__all__ = ["render_environment", "torch_requirement", "cotainr_command", "CONDA_PYTHON", "CONDA_BASE_IMAGE"]

CONDA_PYTHON = "3.11"  # the Python supertune's pins are tested with
# cotainr installs conda and the whole environment (torch with its GPU libraries) into this base,
# which therefore needs no PyTorch of its own.
CONDA_BASE_IMAGE = "docker://ubuntu:24.04"
# The last part of a PyTorch wheel index URL names the build (rocm6.4, cu124); wheels there carry
# it as a local version label (torch 2.x.y+rocm6.4). Pinning the label makes pip take that build
# and never PyPI's wheel of the same version.
_BUILD_LABEL = re.compile(r"^(rocm[0-9.]+|cu[0-9]+|cpu)$")


def torch_requirement(pin: Pin, index_url: str | None) -> str:
    """torch's pin, with the build label of the profile's wheel index when it has one."""
    label = (index_url or "").rstrip("/").rsplit("/", 1)[-1]
    if index_url and _BUILD_LABEL.match(label) and "+" not in pin.version:
        return f"{pin.requirement}+{label}"
    return pin.requirement


def cotainr_command(profile: ClusterProfile, environment: str) -> str:
    """The cotainr build of the environment file (a shell-quoted path) for `profile`: with the site's
    --system where its cotainr knows one (LUMI's lumi-g: the site's ROCm base image), else on a
    plain Ubuntu base (the environment brings torch with its GPU libraries)."""
    base = (
        f"--system={profile.container.cotainr_system}"
        if profile.container.cotainr_system
        else f"--base-image={CONDA_BASE_IMAGE}"
    )
    return f"cotainr build supertune-{profile.name}-conda.sif {base} --conda-env={environment}"


def render_environment(profile: ClusterProfile, pins: list[Pin], source: SupertuneSource) -> str:
    """The text of environment.yml; `pins` are the runtime pins, torch included."""
    import yaml

    index = profile.container.torch_index_url
    pip: list[str] = []
    if index:
        pip.append(f"--extra-index-url {index}")
    for pin in pins:
        pip.append(torch_requirement(pin, index) if pin.key == "torch" else pin.requirement)
    pip.append(str(source.checkout) if source.checkout else source.requirement or f"supertune=={__version__}")
    data = {
        "name": "supertune",
        "channels": ["conda-forge"],
        "dependencies": [f"python={CONDA_PYTHON}", "pip", {"pip": pip}],
    }
    header = [
        f"# Conda environment of supertune {__version__} for the cluster profile {profile.name!r}, written by",
        f"# `supertune container --cluster {profile.name}`. Build an image from it with cotainr, e.g.",
        f"#   {cotainr_command(profile, 'environment.yml')}",
        "# or create it directly: conda env create -f environment.yml",
        "# All versions are the ones supertune is tested with, torch included: its pip wheel brings its",
    ]
    if index:
        header += [
            f"# own GPU libraries, here from the wheel index {index}",
            "# (check that its ROCm/CUDA release runs on the site's driver).",
        ]
    else:
        header += ["# own CUDA libraries (PyPI's Linux wheels of torch are CUDA builds)."]
    if source.checkout:
        header += [
            f"# supertune itself is installed from the checkout {source.checkout}; the build must be able",
            "# to read that path (cotainr runs pip inside the image being built; if the path is not",
            f"# visible there, replace the line with supertune=={__version__} or a git URL).",
        ]
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
