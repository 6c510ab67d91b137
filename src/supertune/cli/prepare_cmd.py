"""`supertune prepare [CONFIG] --out DIR [section.key=value ...]` and `supertune prepare --verify DIR`"""

from __future__ import annotations

import argparse

from .run_config_args import add_run_config_arguments, split_config_and_overrides
import sys

DESCRIPTION = (
    "Tokenize a run config's data once into a token store: fixed-width token-id shards, document offsets, "
    "the train/validation split and a manifest with every file's size and sha256. Train from it with "
    "data.store=DIR. Without CONFIG, the embedded default's data. --verify DIR checks a store instead."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune prepare run.yaml --out /scratch/tokens/my-corpus\n"
        "  supertune prepare --out /tmp/default-store data.add_eos=false\n"
        "  supertune prepare --verify /scratch/tokens/my-corpus     # exit 0 and a summary, or 2 and the reason\n"
        "  supertune train run.yaml data.store=/scratch/tokens/my-corpus\n\n"
        "See docs/store.md for the format and what is checked when."
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_config_arguments(p)
    p.add_argument("--out", help="directory of the new store (must be new or empty; --force replaces a store)")
    p.add_argument("--verify", metavar="DIR", help="check the store DIR (sizes, sha256, offsets) instead of making one")
    p.add_argument("--force", action="store_true", help="replace an existing store at --out")
    p.add_argument("--shard-tokens", type=int, default=None, help="token ids per shard file (default 268435456)")


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    if args.verify:
        if args.out or args.config or args.overrides:
            raise UserError("--verify: takes only the store directory; drop CONFIG, --out and overrides")
        return _verify(args.verify)
    if not args.out:
        raise UserError("--out: where should the store go? e.g. supertune prepare run.yaml --out /scratch/tokens/corpus")
    if args.shard_tokens is not None and args.shard_tokens <= 0:
        raise UserError(f"--shard-tokens: must be positive, got {args.shard_tokens}")
    return _prepare(args)


def _prepare(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ..config import load_run_config
    from ..modeling.tokenizer import load_tokenizer
    from ..store.writer import DEFAULT_SHARD_TOKENS, prepare_store
    config, overrides = split_config_and_overrides(args)
    # The store being made is not read: a data.store in the config (the one training will use) is ignored here.
    cfg = load_run_config(config, overrides + ["data.store="])
    started = time.monotonic()
    tokenizer = load_tokenizer(cfg)
    out = Path(args.out).expanduser().absolute()
    m = prepare_store(cfg, tokenizer, out, args.shard_tokens or DEFAULT_SHARD_TOKENS, args.force)
    seconds = time.monotonic() - started
    train, valid = m.splits["train"], m.splits["validation"]
    print(
        f"supertune: store {out}: train {train.documents:,} documents / {train.tokens:,} tokens, "
        f"validation {valid.documents:,} / {valid.tokens:,}, {m.dtype}, {len(train.shards) + len(valid.shards)} shards, {seconds:.1f} s"
    )
    print(f"supertune: train with: supertune train {config or ''} data.store={out}".replace("  ", " "))
    return 0


def _verify(directory: str) -> int:
    from pathlib import Path

    from ..store.verify import check_store

    m = check_store(Path(directory).expanduser(), hashes=True)
    sizes = sum(e.size for e, _ in m.files())
    parts = [f"{name} {s.documents:,} documents / {s.tokens:,} tokens in {len(s.shards)} shards" for name, s in m.splits.items()]
    print(f"supertune: store {directory} is sound ({sizes:,} bytes checked by size and sha256): " + ", ".join(parts), file=sys.stdout)
    return 0
