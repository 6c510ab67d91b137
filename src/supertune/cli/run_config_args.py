"""The `[CONFIG] [section.key=value ...]` arguments shared by every command that resolves a run config."""

from __future__ import annotations

import argparse
import os

__all__ = ["add_run_config_arguments", "split_config_and_overrides"]


def add_run_config_arguments(
    p: argparse.ArgumentParser, config_help: str = "run config YAML (default: the embedded default run)"
) -> None:
    p.add_argument("config", nargs="?", help=config_help)
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides, applied last")


def split_config_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """argparse cannot tell `train a=b` (override only) from `train run.yaml`.

    An argument with '=', or one that is neither an existing file nor named *.yaml/*.yml, is an override.
    """
    config, overrides = args.config, list(args.overrides)
    looks_like_file = config is not None and (os.path.exists(config) or config.endswith((".yaml", ".yml")))
    if config is not None and ("=" in config or not looks_like_file):
        overrides.insert(0, config)
        config = None
    return config, overrides
