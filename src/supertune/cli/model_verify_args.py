"""`--verify MODE` and `--no-verify`: how `eval` and `generate` check a saved model against its manifest."""

from __future__ import annotations

import argparse

__all__ = ["add_verify_arguments", "verify_mode"]


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verify",
        choices=["auto", "sha256", "size", "none"],
        default="auto",
        help="check the model's files against its manifest (supertune-model.json) before loading: sha256 reads every byte "
        "(about 1 s per GB), size compares sizes only (for very large models); auto: sha256 up to 4 GiB, size above "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="load the model without checking it against its manifest (same as --verify none)",
    )


def verify_mode(args: argparse.Namespace) -> str:
    return "none" if args.no_verify else str(args.verify)
