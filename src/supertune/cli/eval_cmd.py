"""`supertune eval MODEL [--data FILE ...] [section.key=value ...]`; `supertune eval MODEL --tasks a,b`"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .model_verify_args import add_verify_arguments, verify_mode

if TYPE_CHECKING:
    from ..config.schema import EvaluationConfig, RunConfig

DESCRIPTION = (
    "Print the loss and perplexity of a saved model. A model inside a run directory is evaluated with that "
    "run's data settings (block size, template, text field) unless overridden; without --data, on the run's "
    "validation data (the embedded corpus's for the default run). The model of a preference run, or any model "
    "with training.objective=dpo|orpo|simpo|kto, reports the objective's loss, preference accuracy "
    "(rewards/accuracies) and mean margin (rewards/margins) on preference rows instead. With --tasks, run lm-evaluation-harness "
    "tasks on it instead, offline from local data, and record the scores beside the model (its run directory, "
    "its federation, or the model directory): benchmarks.jsonl and benchmarks.md. With --tasks --submit, as a SLURM "
    "job on the cluster of the model's run (or --cluster)."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune eval runs/supertune-20261121-101500/model\n"
        "  supertune eval ./my-model --data valid.jsonl data.block_size=512\n"
        "  supertune eval ./my-chat-model --data conversations.jsonl data.format=chat   # loss over the answers\n"
        "  supertune eval runs/dpo-run/model   # a preference run's model: loss, preference accuracy, mean margin\n"
        "  supertune eval ./my-model --data pairs.jsonl training.objective=dpo model.name_or_path=./base-model\n"
        "  supertune eval runs/supertune-20261121-101500/model --tasks supertune_corpus   # the embedded benchmark\n"
        "  supertune eval federations/fed/round-003/global --tasks hellaswag,arc_easy --limit 200\n"
        "  supertune eval runs/supertune-20261121-101500/model --tasks hellaswag --submit --time 01:00:00   # a job on the run's cluster\n"
        "  supertune eval ./my-model --tasks supertune_corpus --submit --cluster leonardo --dry-run   # print the job script\n"
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
    p.add_argument(
        "--submit",
        action="store_true",
        help="with --tasks: run them as a SLURM job (one process, one node) on the cluster of the model's run",
    )
    p.add_argument("--cluster", help="with --submit: the cluster profile (default: the model's run's launch.cluster)")
    p.add_argument("--time", help="with --submit: the job's wall-clock limit (default: the run's slurm.time)")
    p.add_argument(
        "--dry-run", action="store_true", help="with --submit: print the job script; write and submit nothing"
    )
    add_verify_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.tasks is not None or args.limit is not None:
        return _benchmarks(args)
    _submit_only(args)
    from ..config.load import read_saved_sections
    from ..config.objectives import KNOB_DEFAULTS
    from ..evaluation.perplexity import evaluate_saved_model
    from ..resolve import resolve
    from ..rundir import run_of_model

    base: dict = {}
    run = run_of_model(args.model)
    overrides = list(args.overrides)
    if args.data:  # `--data a.jsonl key=value`: nargs="+" also swallows the overrides that follow
        overrides += [x for x in args.data if "=" in x]
        args.data = [x for x in args.data if "=" not in x]
    objective = _asked_objective(overrides)
    if run is not None:
        saved = read_saved_sections(
            run.config, "supertune writes it when a run starts: restore it, or copy the model out of the run"
        )
        trained = saved.get("training", {})
        objective = objective or trained.get("objective", "sft")
        # The run's seed too: it chose the validation split (data.validation_split_percentage) and the
        # shuffled sample; another seed would evaluate on documents the run trained on.
        keep = {"per_device_eval_batch_size", "seed"}
        if objective == trained.get("objective", "sft"):  # its preference knobs (beta, ...) with its objective
            keep |= {"objective", *KNOB_DEFAULTS}
        base = {"data": saved.get("data", {}), "training": {k: v for k, v in trained.items() if k in keep}}
        if objective != "sft":  # the reference of dpo and kto is the run's start model
            base["model"] = saved.get("model", {})
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
    if cfg.training.objective != "sft":
        return _preference(args, cfg, started_from_run=run is not None)
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


def _asked_objective(overrides: list[str]) -> str | None:
    """training.objective as an override gives it (the last one wins, as in resolve), else None."""
    asked = [o.partition("=")[2].strip() for o in overrides if o.partition("=")[0].strip() == "training.objective"]
    return asked[-1] if asked else None


def _preference(args: argparse.Namespace, cfg: RunConfig, started_from_run: bool) -> int:
    from ..config.objectives import OBJECTIVES
    from ..errors import UserError
    from ..train.preference.preference_eval import evaluate_preference_model

    t = cfg.training
    if OBJECTIVES[t.objective].reference and not started_from_run and cfg.model.name_or_path is None:
        raise UserError(
            f"model.name_or_path: training.objective={t.objective} measures MODEL against the model its training "
            "started from, and MODEL is no run's model; give that start model, e.g. model.name_or_path=./base-model"
        )
    m = evaluate_preference_model(args.model, cfg, verify_mode(args))
    rows = f"{m['rows']} {'pairs' if OBJECTIVES[t.objective].rows == 'pairs' else 'rows'}"
    headline = {"rewards/accuracies": "preference accuracy", "rewards/margins": "mean margin"}
    shown = [f"eval loss {m['eval_loss']:.6f} (training.objective={t.objective})"]
    shown += [f"{what} ({name}) {m['eval_' + name]:.6f}" for name, what in headline.items() if "eval_" + name in m]
    print("  ".join(shown) + f"  ({rows})")
    rest = [k.removeprefix("eval_") for k in m if k.startswith("eval_") and k != "eval_loss"]
    print("  ".join(f"{name} {m['eval_' + name]:.6f}" for name in rest if name not in headline))
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
    if args.submit:
        return _submit(args, e)
    _submit_only(args)
    scores, table, warnings = benchmark_saved_model(args.model, tasks, e, verify_mode(args))
    print(scores_table([{"model": args.model, "scores": scores}]), end="")
    print(f"scores recorded in {table} and {table.with_suffix('.jsonl')}")
    for warning in warnings:
        print(f"warning: {warning}")
    return 0


def _submit_only(args: argparse.Namespace) -> None:
    from ..errors import UserError

    given = [f for f, v in (("--submit", args.submit), ("--cluster", args.cluster), ("--time", args.time),
                            ("--dry-run", args.dry_run)) if v]  # fmt: skip
    if given:
        with_what = "with --tasks --submit" if given[0] != "--submit" else "with --tasks (benchmarks)"
        raise UserError(f"{given[0]}: only applies {with_what}; add it or drop {given[0]}")


def _submit(args: argparse.Namespace, e: EvaluationConfig) -> int:
    import os
    import sys

    from ..benchmarks.job import BenchmarkJob, plan_benchmark_job, submit_benchmark_job
    from ..errors import UserError
    from ..slurm.script import render_sbatch

    bench = BenchmarkJob(_absolute(args.model), tuple(e.tasks), e.limit, e.batch_size, verify_mode(args))
    if not os.path.isdir(bench.model):
        raise UserError(f"MODEL: {args.model!r} is not a directory; give a saved model such as runs/<run>/model")
    job, profile, directory = plan_benchmark_job(bench, args.cluster, args.time)
    script = render_sbatch(job, profile, "MODEL")  # a value the script cannot hold fails before anything is written
    if args.dry_run:
        sys.stdout.write(script)
        print(f"supertune: dry run: nothing written, nothing submitted (the script would be {directory.job_script})",
              file=sys.stderr)  # fmt: skip
        return 0
    from ..benchmarks import check_tasks
    from ..checkpoints.model_files import check_saved_model

    # A wrong task, missing data or a damaged model is refused here, not after a wait in the queue.
    check_saved_model(bench.model, "MODEL", "size", tokenizer=False)
    check_tasks(list(bench.tasks), "--tasks")
    job_id = submit_benchmark_job(script, directory, profile.name)
    print(job_id)
    print(f"supertune: submitted job {job_id} on {profile.name}; log in {directory.logs}; the scores will be "
          f"recorded in {directory.path.parent / 'benchmarks.md'}", file=sys.stderr)  # fmt: skip
    return 0


def _absolute(model: str) -> str:
    from pathlib import Path

    return str(Path(model).expanduser().absolute())


_ANSWERS = {"assistant": "assistant turns' tokens", "completion": "completions' tokens"}


def _quoted(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"
