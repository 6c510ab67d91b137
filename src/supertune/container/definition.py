"""The Apptainer/Singularity definition file of a supertune image for one cluster.

torch is deliberately not installed: the base image's torch is built for the image's CUDA or ROCm
libraries (and, in vendor images, tuned for the hardware), and a pip wheel would replace it with
a different build. pip installs supertune's tested pins of everything else, under a constraint
that keeps the image's torch.
"""

from __future__ import annotations

from .. import __version__
from ..clusters.schema import ClusterProfile
from ..clusters.validate import BOOTSTRAP_AGENTS
from .pins import Pin
from .source import SupertuneSource

__all__ = ["render_definition", "bootstrap", "container_env", "MIN_PYTHON"]

# requires-python of pyproject.toml; checked in the image before anything is installed.
MIN_PYTHON = (3, 11)
# Variables of the profile's env that belong in the image: where caches live and offline mode.
# The rest (NCCL interfaces, thread counts, MIOpen paths with the job id) depend on the node and
# the job, and the job script sets them.
_IMAGE_ENV_PREFIXES = ("HF_", "TRANSFORMERS_", "TOKENIZERS_")
_IMAGE_ENV_NAMES = {"TORCH_HOME"}
_SOURCE_DIR = "/opt/supertune-src"


def bootstrap(base_image: str) -> tuple[str, str]:
    """(Bootstrap agent, From value) of a base image reference."""
    for scheme, agent in BOOTSTRAP_AGENTS.items():
        if base_image.startswith(scheme):
            return agent, base_image[len(scheme) :]
    return "localimage", base_image  # a .sif path (the profile check allows nothing else)


def container_env(profile: ClusterProfile) -> dict[str, str]:
    """The part of the profile's env written into the image."""
    return {k: v for k, v in profile.env.items() if k.startswith(_IMAGE_ENV_PREFIXES) or k in _IMAGE_ENV_NAMES}


def render_definition(profile: ClusterProfile, pins: list[Pin], source: SupertuneSource) -> str:
    """The text of supertune.def; `pins` are the runtime pins (torch among them is left out)."""
    assert profile.container.base_image, "callers refuse profiles without a base image"
    agent, origin = bootstrap(profile.container.base_image)
    runtime = profile.container.runtime if profile.container.runtime != "none" else "apptainer"
    gpu_flag = {"nvidia": " --nv", "amd": " --rocm"}.get(profile.gpu_vendor, "")
    installed = [p for p in pins if p.key != "torch"]
    out = [
        f"Bootstrap: {agent}",
        f"From: {origin}",
        "",
        f"# supertune {__version__} for the cluster profile {profile.name!r}, written by",
        f"# `supertune container --cluster {profile.name}`. Build it where there is network access:",
        f"#   {runtime} build supertune-{profile.name}.sif supertune.def",
        "# torch comes from the base image, built for its CUDA/ROCm libraries; pip installs supertune's",
        "# tested versions of everything else and is not allowed to replace that torch.",
        "",
    ]
    if source.checkout:
        out += ["%files"]
        out += [f"    {source.checkout / part} {_SOURCE_DIR}/{part}" for part in ("pyproject.toml", "README.md", "src")]
        out += [""]
    out += [
        "%post",
        "    set -e",
        "    # A Docker image's ENV (the PATH to its Python with torch) is not always in effect while",
        "    # %post runs; Apptainer keeps it here.",
        "    if [ -f /.singularity.d/env/10-docker2singularity.sh ]; then",
        "        . /.singularity.d/env/10-docker2singularity.sh",
        "    fi",
        f"    python3 -c 'import sys; sys.exit(0 if sys.version_info >= {MIN_PYTHON} else \"supertune needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}, the base image has \" + sys.version.split()[0])'",
        "    python3 -c 'import torch' || { echo 'the base image has no torch: choose a PyTorch image as container.base_image' >&2; exit 1; }",
        "    # Keep the image's torch: pip must not swap it for a wheel of another build.",
        "    python3 -c 'import torch; print(\"torch==\" + torch.__version__)' > /tmp/keep-torch.txt",
        "    # Ubuntu 24.04 based images mark the system Python as externally managed (PEP 668); this",
        "    # image is built for supertune alone.",
        "    export PIP_BREAK_SYSTEM_PACKAGES=1",
        "    # Some vendor images set PIP_CONSTRAINT to their own versions; supertune's tested ones win here.",
        "    unset PIP_CONSTRAINT",
        "    python3 -m pip install --no-cache-dir --constraint /tmp/keep-torch.txt \\",
    ]
    out += [f'        "{p.requirement}" \\' for p in installed[:-1]]
    out += [f'        "{installed[-1].requirement}"'] if installed else []
    target = _SOURCE_DIR if source.checkout else f'"{source.requirement}"'
    out += [
        "    # supertune itself without dependencies: they are all installed above, and its torch range",
        "    # would reject the pre-release versions some images carry (NGC's are x.y.0a0).",
        f"    python3 -m pip install --no-cache-dir --no-deps {target}",
        f"    rm -rf {_SOURCE_DIR} /tmp/keep-torch.txt" if source.checkout else "    rm -f /tmp/keep-torch.txt",
        '    python3 -c \'import supertune, torch, transformers; print("supertune", supertune.__version__, "torch", torch.__version__, "transformers", transformers.__version__)\'',
        "",
        "%environment",
        "    # Cache and offline settings of the cluster profile; a value set before the container",
        "    # starts (by the job script or the user) wins.",
    ]
    out += [
        f'    if [ -z "${{{name}:-}}" ]; then export {name}="{_double_quoted(value)}"; fi'
        for name, value in container_env(profile).items()
    ]
    out += [
        "    # $HOME is bound into the container: packages in ~/.local would shadow the pinned ones.",
        '    if [ -z "${PYTHONNOUSERSITE:-}" ]; then export PYTHONNOUSERSITE=1; fi',
        "",
        "%labels",
        f"    org.supertune.version {__version__}",
        f"    org.supertune.cluster {profile.name}",
        f"    org.supertune.base-image {profile.container.base_image}",
        "    org.supertune.torch from-base-image",
        "",
        "%help",
        f"    supertune {__version__} with its tested dependencies, for {profile.description or profile.name}.",
        f"    torch is the base image's ({profile.container.base_image}).",
        f"    Example: {runtime} exec{gpu_flag} supertune-{profile.name}.sif supertune train run.yaml",
        "",
        "%test",
        "    python3 -m supertune --version",
        "",
    ]
    return "\n".join(out)


def _double_quoted(value: str) -> str:
    """`value` inside "...": $NAME references stay live (the profile allows no other $ forms)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
