"""`supertune env`: this process's place in the job, as supertune sees it."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = (
    "Print the launch environment as supertune resolves it: global and local rank, world size, node rank, "
    "number of nodes, master address and port, the launcher whose variables said so, and the device index."
)


def epilog() -> str:
    return "examples:\n  supertune env\n  srun -N2 --ntasks-per-node=4 supertune env --json   # one line per task\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    from ..launch.environment import launch_environment

    view = launch_environment().as_dict()
    if args.json:
        print(json.dumps(view, sort_keys=True))
    else:
        width = max(len(k) for k in view)
        for key, value in view.items():
            print(f"{key:<{width}}  {'-' if value is None else value}")
    return 0
