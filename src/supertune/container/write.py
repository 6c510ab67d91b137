"""Write a cluster's container recipes to a directory and say how to build them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..clusters.schema import ClusterProfile
from ..errors import UserError
from ..output_dirs import make_output_dir, marked_as
from .conda_env import cotainr_command, render_environment
from .definition import render_definition
from .pins import Pin, runtime_pins
from .source import SupertuneSource, resolve_source

__all__ = ["ContainerFiles", "write_container_files"]

DEFINITION_NAME = "supertune.def"
ENVIRONMENT_NAME = "environment.yml"


@dataclass
class ContainerFiles:
    """What was written, and the commands that build an image from each file."""

    definition: Path
    environment: Path
    source: SupertuneSource
    pins: list[Pin]
    build_commands: list[str] = field(default_factory=list)


def write_container_files(profile: ClusterProfile, out_dir: str | Path, supertune: str | None = None) -> ContainerFiles:
    """Write supertune.def and environment.yml for `profile` into `out_dir` (created if missing)."""
    if not profile.container.base_image:
        raise UserError(
            f"--cluster: the profile {profile.name!r} has no container.base_image, so there is no image to build "
            "(it runs on the host Python); choose a GPU cluster (supertune clusters list) or set container.base_image "
            "in your own profile, e.g. docker://nvcr.io/nvidia/pytorch:25.01-py3"
        )
    source = resolve_source(supertune)
    pins = runtime_pins()
    if not any(p.key == "torch" for p in pins):
        raise UserError("pinned-requirements.txt has no torch pin; reinstall supertune")
    out = make_output_dir(out_dir, "--out", "container recipes", own=marked_as("container"), mark="container")
    definition = out / DEFINITION_NAME
    environment = out / ENVIRONMENT_NAME
    definition.write_text(render_definition(profile, pins, source), encoding="utf-8")
    environment.write_text(render_environment(profile, pins, source), encoding="utf-8")
    runtime = profile.container.runtime if profile.container.runtime != "none" else "apptainer"
    image = f"supertune-{profile.name}.sif"
    commands = [
        f"{runtime} build {image} {shlex.quote(str(definition))}",
        cotainr_command(profile, shlex.quote(str(environment))),
    ]
    return ContainerFiles(definition, environment, source, pins, commands)
