"""`supertune container --cluster NAME [--out DIR]`"""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Write the recipes of a container image for a cluster: DIR/supertune.def, an Apptainer/Singularity "
    "definition on the profile's base image (its torch is kept; supertune's tested versions of everything "
    "else are installed), and DIR/environment.yml, a conda environment with every tested version including "
    "torch, for cotainr. Prints the build commands; building needs network access."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune container --cluster lumi                 # writes container-lumi/supertune.def and environment.yml\n"
        "  supertune container --cluster leonardo --out img/\n"
        "  supertune container --cluster karolina --supertune supertune==0.1.0\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, metavar="NAME", help="cluster profile (supertune clusters list)")
    p.add_argument("--out", metavar="DIR", help="directory to write into (default: container-NAME)")
    p.add_argument(
        "--supertune",
        metavar="SPEC",
        help="how the image gets supertune: a source checkout directory, or a pip requirement such as "
        "supertune==0.1.0 (default: this checkout when run from one, else supertune==VERSION)",
    )


def run(args: argparse.Namespace) -> int:
    from ..clusters import load_profile
    from ..container import write_container_files

    profile = load_profile(args.cluster, what="--cluster")
    files = write_container_files(profile, args.out or f"container-{profile.name}", args.supertune)
    installed = [p for p in files.pins if p.key != "torch"]
    print(
        f"supertune: wrote {files.definition} (base {profile.container.base_image}; torch from the image, "
        f"{len(installed)} pinned packages and supertune from {files.source.describe()})"
    )
    print(
        f"supertune: wrote {files.environment} (conda environment: python, all {len(files.pins)} pins including torch)"
    )
    print("supertune: build one of them where there is network access:")
    for command in files.build_commands:
        print(f"  {command}")
    print(f"supertune: then set container.image to the .sif path in your {profile.name} profile so that jobs run in it")
    return 0
