"""The tasks of `supertune prepare --submit`: entry point `prepare-array` of supertune.entry, which
the array job runs with `--part I --work DIR` and the merge job with `--merge WORK`.

`supertune prepare` takes the same flags, hidden from its --help, for job scripts rendered before
the entry point existed; both go through `run` here.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from .manifest import Manifest

__all__ = ["add_arguments", "run", "is_array_task"]


def add_arguments(p: argparse.ArgumentParser, hidden: bool = False) -> None:
    def help_(text: str) -> str:
        return argparse.SUPPRESS if hidden else text

    p.add_argument("--part", type=int, metavar="I", help=help_("(the array job) tokenize part I of --work"))
    p.add_argument("--work", metavar="DIR", help=help_("(the array job) the work directory of a prepare --submit"))
    p.add_argument(
        "--merge", metavar="WORK", help=help_("(the merge job) merge the finished parts of WORK into the store")
    )


def is_array_task(args: argparse.Namespace) -> bool:
    return args.part is not None or bool(args.work) or bool(args.merge)


def run(args: argparse.Namespace) -> int:
    from .array import merge_parts, run_part

    if args.part is not None or args.work:
        if args.part is None or not args.work:
            raise UserError("--part: give both --part I and --work DIR (the array job does this)")
        run_part(Path(args.work).expanduser().absolute(), args.part)
        return 0
    if not args.merge:
        raise UserError("--part I --work DIR (an array task) or --merge WORK (the merge job): give one")
    started = time.monotonic()
    out, m = merge_parts(Path(args.merge).expanduser().absolute())
    print_summary(out, m, time.monotonic() - started)
    return 0


def print_summary(out: Path, m: Manifest, seconds: float) -> None:
    """The store's one-line summary, after a prepare or a merge."""
    train, valid = m.splits["train"], m.splits["validation"]
    print(
        f"supertune: store {out}: train {train.documents:,} documents / {train.tokens:,} tokens, "
        f"validation {valid.documents:,} / {valid.tokens:,}, {m.dtype}, {len(train.shards) + len(valid.shards)} shards, {seconds:.1f} s"
    )
