"""The entry point `bench-eval MODEL --tasks A,B [--limit N] [--batch-size B] [--verify MODE]`: what
the job of `supertune eval --tasks --submit` runs, on a node of the cluster. It scores the model
and records the scores as `supertune eval --tasks` does where it is started."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="the saved model directory")
    p.add_argument("--tasks", required=True, metavar="A,B", help="the harness tasks, comma-separated")
    p.add_argument("--limit", type=int, metavar="N", help="the first N documents of each task")
    p.add_argument("--batch-size", type=int, required=True, metavar="B")
    p.add_argument("--verify", default="auto", choices=["auto", "sha256", "size", "none"])


def run(args: argparse.Namespace) -> int:
    from ..config.schema import EvaluationConfig
    from .results import scores_table
    from .saved_model import benchmark_saved_model

    tasks = [t for t in args.tasks.split(",") if t]
    e = EvaluationConfig(tasks=tasks, limit=args.limit, batch_size=args.batch_size)
    scores, table, warnings = benchmark_saved_model(args.model, tasks, e, args.verify)
    print(scores_table([{"model": args.model, "scores": scores}]), end="")
    print(f"supertune: scores recorded in {table} and {table.with_suffix('.jsonl')}", flush=True)
    for warning in warnings:
        print(f"supertune: warning: {warning}", flush=True)
    return 0
