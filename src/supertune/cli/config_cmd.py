"""`supertune config show [CONFIG] [overrides]` and `supertune config keys`."""

from __future__ import annotations

import argparse

from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = "Print the fully resolved config (defaults < CONFIG < overrides), or the reference of every key."


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune config show run.yaml training.max_steps=10\n"
        "  supertune config keys\n"
        "  supertune config keys --markdown > docs/config.md\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show", "keys"], help="show: resolved config as YAML; keys: every key with its meaning")
    add_run_config_arguments(p, config_help="run config YAML (show)")
    p.add_argument("--markdown", action="store_true", help="keys: print the Markdown reference (docs/config.md)")


def run(args: argparse.Namespace) -> int:
    if args.action == "keys":
        from ..config.docs import keys_markdown, keys_reference

        print(keys_markdown() if args.markdown else keys_reference(), end="" if args.markdown else "\n")
        return 0
    from ..config import dump_config, load_run_config
    config, overrides = split_config_and_overrides(args)
    print(dump_config(load_run_config(config, overrides)), end="")
    return 0
