"""`supertune config show [CONFIG] [overrides]` and `supertune config keys`."""

from __future__ import annotations

import argparse

from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = (
    "Print the fully resolved config (defaults < cluster profile < CONFIG < overrides), or the reference of every key. "
    "With --origin, each value that is not the default with the layer that set it."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune config show run.yaml training.max_steps=10\n"
        "  supertune config show run.yaml launch.cluster=ibex training.fp16=false --origin\n"
        "  supertune config keys\n"
        "  supertune config keys --markdown > docs/config.md\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", choices=["show", "keys"], help="show: resolved config as YAML; keys: every key with its meaning"
    )
    add_run_config_arguments(p, config_help="run config YAML (show)")
    p.add_argument("--markdown", action="store_true", help="keys: print the Markdown reference (docs/config.md)")
    p.add_argument(
        "--origin", action="store_true", help="show: each value that is not the default, with the layer that set it"
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "keys":
        from ..config.docs import keys_markdown, keys_reference

        print(keys_markdown() if args.markdown else keys_reference(), end="" if args.markdown else "\n")
        return 0
    from ..config import dump_config
    from ..resolve import origin_lines, resolve

    config, overrides = split_config_and_overrides(args)
    resolution = resolve(config, overrides)
    if args.origin:
        print("\n".join(origin_lines(resolution)))
    else:
        print(dump_config(resolution.config), end="")
    return 0
