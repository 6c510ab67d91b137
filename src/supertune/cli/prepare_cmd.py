"""`supertune prepare [CONFIG] --out DIR [--bundle] [--submit --cluster NAME --shards N] [key=value ...]` and `--verify DIR`"""

from __future__ import annotations

import argparse
import sys

from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = (
    "Tokenize a run config's data once into a token store: fixed-width token-id shards, document offsets, "
    "the train/validation split and a manifest with every file's size and sha256. Train from it with "
    "data.store=DIR. Without CONFIG, the embedded default's data. --submit runs it as a SLURM array job "
    "(one task per part, then a merge job); --verify DIR checks a store instead."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune prepare run.yaml --out /scratch/tokens/my-corpus\n"
        "  supertune prepare run.yaml --out /scratch/tokens/my-corpus --bundle   # + tokenizer and model config, for offline nodes\n"
        "  supertune prepare run.yaml --out /scratch/tokens/big --submit --cluster lumi --shards 16 --time 04:00:00\n"
        "  supertune prepare --verify /scratch/tokens/my-corpus     # exit 0 and a summary, or 2 and the reason\n"
        "  supertune train run.yaml data.store=/scratch/tokens/my-corpus\n\n"
        "Running --submit again after a failed task resubmits only the unfinished parts, and the merge.\n"
        "See docs/store.md for the format and what is checked when."
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..store.array_entry import add_arguments as add_array_task_arguments

    add_run_config_arguments(p)
    p.add_argument("--out", help="directory of the new store (must be new or empty; --force replaces a store)")
    p.add_argument("--verify", metavar="DIR", help="check the store DIR (sizes, sha256, offsets) instead of making one")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing store at --out (with --submit: also discard parts of another plan)",
    )
    p.add_argument("--shard-tokens", type=int, default=None, help="token ids per shard file (default 268435456)")
    p.add_argument(
        "--bundle",
        action="store_true",
        help="also save the tokenizer and model config in the store (read with model.bundle=DIR)",
    )
    p.add_argument(
        "--submit", action="store_true", help="run as a SLURM array job on --cluster, --shards tasks, then a merge job"
    )
    p.add_argument("--cluster", help="with --submit: cluster profile (see `supertune clusters list`)")
    p.add_argument("--shards", type=int, help="with --submit: array tasks, each tokenizing one part of the documents")
    p.add_argument("--time", help="with --submit: wall-clock limit of each task and of the merge (slurm.time)")
    p.add_argument("--cpus", type=int, help="with --submit: cores per task (default: the profile's cores per node)")
    p.add_argument("--dry-run", action="store_true", help="with --submit: print the job scripts; submit nothing")
    # The array and merge jobs' own flags (entry point prepare-array), hidden: job scripts rendered
    # before that entry point existed still run `supertune prepare --part I --work DIR`.
    add_array_task_arguments(p, hidden=True)


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    if args.verify:
        if args.out or args.config or args.overrides:
            raise UserError("--verify: takes only the store directory; drop CONFIG, --out and overrides")
        return _verify(args.verify)
    from ..store import array_entry

    if array_entry.is_array_task(args):
        return array_entry.run(args)
    if not args.out:
        raise UserError(
            "--out: where should the store go? e.g. supertune prepare run.yaml --out /scratch/tokens/corpus"
        )
    if args.shard_tokens is not None and args.shard_tokens <= 0:
        raise UserError(f"--shard-tokens: must be positive, got {args.shard_tokens}")
    submit_only = {
        "--cluster": args.cluster,
        "--shards": args.shards,
        "--time": args.time,
        "--cpus": args.cpus,
        "--dry-run": args.dry_run or None,
    }
    if not args.submit:
        given = [flag for flag, value in submit_only.items() if value is not None]
        if given:
            raise UserError(f"{given[0]}: only applies with --submit (a SLURM array job); add --submit or drop it")
        return _prepare(args)
    return _submit(args)


def _load(args: argparse.Namespace, extra: list[str]):
    from ..resolve import resolve_run_config

    config, overrides = split_config_and_overrides(args)
    # The store being made is not read: data.store and model.bundle in the config (what training will
    # use, maybe this store) are ignored here. prepare reads map-style datasets: the split of a store
    # is the validation files or the percentage split, whatever data.streaming says. Nothing trains
    # here: a site's config with its training strategy (fsdp, zero3) is prepared as it is.
    cfg = resolve_run_config(
        config, overrides + extra + ["data.store=", "model.bundle=", "data.streaming=false"], trains=False
    )
    return config, cfg


def _prepare(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ..modeling.tokenizer import load_tokenizer
    from ..store.array_entry import print_summary
    from ..store.writer import DEFAULT_SHARD_TOKENS, prepare_store

    config, cfg = _load(args, [])
    started = time.monotonic()
    tokenizer = load_tokenizer(cfg)
    out = Path(args.out).expanduser().absolute()
    m = prepare_store(cfg, tokenizer, out, args.shard_tokens or DEFAULT_SHARD_TOKENS, args.force, args.bundle)
    print_summary(out, m, time.monotonic() - started)
    print(f"supertune: train with: supertune train {config or ''} data.store={out}".replace("  ", " "))
    return 0


MAX_ARRAY_TASKS = 4_000_001
"""The largest MaxArraySize Slurm accepts (slurm.conf(5)): no array can have more tasks."""


def _submit(args: argparse.Namespace) -> int:
    from collections.abc import Sequence
    from pathlib import Path

    from ..clusters import load_profile
    from ..config import dump_config
    from ..errors import UserError
    from ..slurm.prepare_jobs import prepare_job, render_prepare, submit_prepare
    from ..store.array import PLAN, check_work_dir, finished_parts, plan_array, work_dir
    from ..store.writer import DEFAULT_SHARD_TOKENS, check_target

    if not args.cluster:
        raise UserError(
            "--cluster: --submit needs the cluster profile, e.g. --cluster lumi (see supertune clusters list)"
        )
    if args.shards is None or args.shards <= 0:
        raise UserError(f"--shards: --submit needs a positive number of array tasks, got {args.shards}")
    if args.shards > MAX_ARRAY_TASKS:
        raise UserError(
            f"--shards: {args.shards} array tasks are more than Slurm can run as one array "
            f"(MaxArraySize is at most {MAX_ARRAY_TASKS}); use fewer, larger parts, e.g. --shards 64"
        )
    if args.cpus is not None and args.cpus <= 0:
        raise UserError(f"--cpus: must be positive, got {args.cpus}")
    flags = [f"launch.cluster={args.cluster}"] + ([f"slurm.time={args.time}"] if args.time else [])
    _, cfg = _load(args, flags)
    profile = load_profile(cfg.launch.cluster)
    out = Path(args.out).expanduser().absolute()
    work = work_dir(out)
    check_target(out, args.force)  # refused before any script is shown: the user's files at the store
    check_work_dir(out)  # or at its work directory <out>.prepare
    job = prepare_job(cfg, profile, out, work, args.shards, args.cpus)
    todo: Sequence[int] = range(args.shards)  # not a list: the dry run renders it without one
    array_script, merge_script = render_prepare(
        job, profile, todo
    )  # a value the scripts cannot hold fails before anything is written
    if args.dry_run:
        sys.stdout.write(f"{array_script}\n{merge_script}")
        print("supertune: dry run: nothing written, nothing submitted", file=sys.stderr)
        return 0
    if cfg.data.format != "text":
        # A bad conversation or a template that cannot mark the answers, refused here with its row
        # rather than by an array task in the queue (seconds: every row's shape, the first rows encoded).
        from ..modeling.tokenizer import load_tokenizer
        from ..training_data.row_checks import check_rows_before_start

        check_rows_before_start(cfg.data, load_tokenizer(cfg))
    made = work  # the topmost directory this call makes, removed again if sbatch refuses the first job
    while not made.parent.exists():
        made = made.parent
    new = not (work / PLAN).is_file()  # plan_array makes the work directory anew
    plan_array(
        cfg, dump_config(cfg), out, args.shards, args.shard_tokens or DEFAULT_SHARD_TOKENS, args.bundle, args.force
    )
    done = finished_parts(work, args.shards)
    finished = set(done)
    todo = [i for i in todo if i not in finished]
    array_id, merge_id = submit_prepare(job, render_prepare(job, profile, todo), profile.name, made if new else None)
    if done:
        print(
            f"supertune: prepare: {len(done)} of {args.shards} parts are finished already and are not submitted again",
            file=sys.stderr,
        )
    print(merge_id)
    tasks = f"array job {array_id} ({len(todo)} tasks), then " if array_id else ""
    print(
        f"supertune: submitted {tasks}merge job {merge_id}; logs in {work / 'logs'}; the store will be {out}",
        file=sys.stderr,
    )
    return 0


def _verify(directory: str) -> int:
    from pathlib import Path

    from ..store.verify import check_store

    m = check_store(Path(directory).expanduser(), hashes=True)
    sizes = sum(e.size for e, _ in m.files())
    parts = [
        f"{name} {s.documents:,} documents / {s.tokens:,} tokens in {len(s.shards)} shards"
        for name, s in m.splits.items()
    ]
    print(
        f"supertune: store {directory} is sound ({sizes:,} bytes checked by size and sha256): " + ", ".join(parts),
        file=sys.stdout,
    )
    return 0
