"""Container recipes for a cluster: an Apptainer/Singularity definition and a conda environment.

Both carry supertune's tested pins (pinned-requirements.txt). Nothing here imports torch.
"""

from .conda_env import render_environment, torch_requirement
from .definition import container_env, render_definition
from .pins import Pin, read_pins, runtime_pins
from .source import SupertuneSource, checkout_root, resolve_source
from .write import ContainerFiles, write_container_files

__all__ = [
    "ContainerFiles",
    "Pin",
    "SupertuneSource",
    "checkout_root",
    "container_env",
    "read_pins",
    "render_definition",
    "render_environment",
    "resolve_source",
    "runtime_pins",
    "torch_requirement",
    "write_container_files",
]
