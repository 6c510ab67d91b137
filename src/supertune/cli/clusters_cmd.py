"""`supertune clusters list` and `supertune clusters show NAME`."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "List the cluster profiles (shipped with supertune, and your own in the user profile directory), "
    "or show one as merged YAML with the files it came from. A profile gives a site's GPUs per node, "
    "modules, container and job environment; launch.cluster and --cluster name it."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune clusters list\n"
        "  supertune clusters show lumi\n"
        "  supertune clusters show lumi > ~/.config/supertune/clusters/lumi.yaml   # then keep only what you change\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show"], help="list: every profile in a table; show: one profile as YAML")
    p.add_argument("name", nargs="?", help="profile name (show), e.g. lumi")


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    if args.action == "list":
        if args.name:
            raise UserError(
                f"clusters list takes no name (got {args.name!r}); to see one profile: supertune clusters show {args.name}"
            )
        print(_table())
        return 0
    if not args.name:
        from ..clusters import profile_names

        raise UserError(
            f"clusters show: give a profile name, e.g. supertune clusters show lumi; known: {', '.join(profile_names())}"
        )
    print(_show(args.name), end="")
    return 0


def _table() -> str:
    from ..clusters import list_profiles, profile_sources, user_profile_dir

    sources = profile_sources()
    rows = [("NAME", "GPUS/NODE", "GPU MODEL", "VENDOR", "DESCRIPTION")]
    for p in list_profiles():
        marker = " (user)" if sources[p.name].user else ""
        rows.append((p.name + marker, str(p.gpus_per_node), p.gpu_model or "-", p.gpu_vendor, p.description))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    user_dir = user_profile_dir()
    lines.append("")
    lines.append(
        f"user profiles: {user_dir}{'' if user_dir.is_dir() else ' (does not exist)'}; (user) marks a profile with a user file"
    )
    return "\n".join(line.rstrip() for line in lines)


def _show(name: str) -> str:
    import dataclasses

    import yaml

    from ..clusters import load_profile_with_sources

    profile, sources = load_profile_with_sources(name, what="clusters show")
    header = f"# cluster profile {name}: {sources.describe()}\n"
    return header + yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False, allow_unicode=True, width=120)
