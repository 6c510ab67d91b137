"""`supertune eval MODEL [--data FILE ...] [section.key=value ...]`; `supertune eval MODEL --tasks a,b`"""

from __future__ import annotations

import argparse

from .model_verify_args import add_verify_arguments, verify_mode

DESCRIPTION = (
    "Print the loss and perplexity of a saved model. A model inside a run directory is evaluated with that "
    "run's data settings (block size, template, text field) unless overridden; without --data, on the run's "
    "validation data (the embedded corpus's for the default run). With --tasks, run lm-evaluation-harness "
    "tasks on it instead, offline from local data, and record the scores beside the model (its run directory, "
    "its federation, or the model directory): benchmarks.jsonl and benchmarks.md."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune eval runs/supertune-20261121-101500/model\n"
        "  supertune eval ./my-model --data valid.jsonl data.block_size=512\n"
        "  supertune eval ./my-chat-model --data conversations.jsonl data.format=chat   # loss over the answers\n"
        "  supertune eval runs/supertune-20261121-101500/model --tasks supertune_corpus   # the embedded benchmark\n"
        "  supertune eval federations/fed/round-003/global --tasks hellaswag,arc_easy --limit 200\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model directory (Hugging Face format)")
    p.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="data/training overrides, e.g. data.block_size=256"
    )
    p.add_argument(
        "--data", nargs="+", metavar="FILE", help="evaluation files or globs (default: the run's validation data)"
    )
    p.add_argument("--batch-size", type=int, help="sequences per evaluation batch")
    p.add_argument(
        "--tasks",
        metavar="A,B",
        help="lm-evaluation-harness tasks, comma-separated: supertune_corpus (embedded, offline), a harness task or "
        "group (its data in the local Hugging Face datasets cache), or a task YAML file",
    )
    p.add_argument("--limit", type=int, metavar="N", help="with --tasks: the first N documents of each task")
    add_verify_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..config import read_config_file
    from ..evaluation.perplexity import evaluate_saved_model
    from ..resolve import resolve
    from ..rundir import run_of_model

    if args.tasks is not None or args.limit is not None:
        return _benchmarks(args)
    base: dict = {}
    run = run_of_model(args.model)
    if run is not None:
        saved = read_config_file(run.config)
        # The run's seed too: it chose the validation split (data.validation_split_percentage) and the
        # shuffled sample; another seed would evaluate on documents the run trained on.
        training = {k: v for k, v in saved.get("training", {}).items() if k in ("per_device_eval_batch_size", "seed")}
        base = {"data": saved.get("data", {}), "training": training}
    overrides = list(args.overrides)
    if args.data:  # `--data a.jsonl key=value`: nargs="+" also swallows the overrides that follow
        overrides += [x for x in args.data if "=" in x]
        args.data = [x for x in args.data if "=" not in x]
    if args.data:
        base.setdefault("data", {}).update(
            validation_files=[], dataset_name=None, dataset_config=None, streaming=False, store=None
        )
        given = "[" + ",".join(_quoted(f) for f in args.data) + "]"
        # As validation files, evaluated whole (as training files, a share would be held out); the
        # same files as training files too, so that validation sees a complete data section.
        overrides += [f"data.validation_files={given}", f"data.train_files={given}"]
    if args.batch_size is not None:
        overrides.append(f"training.per_device_eval_batch_size={args.batch_size}")
    cfg = resolve(None, overrides, base=base, base_name=f"run {run.path}" if run else "base").config
    metrics = evaluate_saved_model(args.model, cfg, verify_mode(args))
    over = (
        ""
        if cfg.data.loss_target == "all"
        else f" over the {_ANSWERS[cfg.data.loss_target]} (data.loss_on={cfg.data.loss_target})"
    )
    print(
        f"eval loss {metrics['eval_loss']:.6f}  perplexity {metrics['perplexity']:.4f}{over}  ({metrics['sequences']} sequences, {metrics['tokens']} tokens)"
    )
    return 0


def _benchmarks(args: argparse.Namespace) -> int:
    from ..benchmarks import scores_table
    from ..benchmarks.saved_model import benchmark_saved_model
    from ..config.schema import EvaluationConfig
    from ..errors import UserError

    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if not tasks:
        raise UserError("--tasks: name at least one task, e.g. --tasks supertune_corpus")
    if args.overrides or args.data:
        raise UserError(
            "--tasks runs benchmarks: leave out --data and section.key=value overrides (they set the loss evaluation)"
        )
    for option, value in (("--limit", args.limit), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise UserError(f"{option}: must be positive, got {value}")
    e = EvaluationConfig(tasks=tasks, limit=args.limit, batch_size=args.batch_size or EvaluationConfig.batch_size)
    scores, table, warnings = benchmark_saved_model(args.model, tasks, e, verify_mode(args))
    print(scores_table([{"model": args.model, "scores": scores}]), end="")
    print(f"scores recorded in {table} and {table.with_suffix('.jsonl')}")
    for warning in warnings:
        print(f"warning: {warning}")
    return 0


_ANSWERS = {"assistant": "assistant turns' tokens", "completion": "completions' tokens"}


def _quoted(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"
