"""Benchmark scores in a run directory: benchmarks.jsonl (one record per evaluation, appended) and
benchmarks.md (every record as one markdown table, rewritten each time), and their names as
metrics (`bench/<task>/<metric>`) for metrics.jsonl and the tracking sinks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..json_lines import read_records
from ..rundir import RunDir

__all__ = ["record_scores", "scores_table", "flat_scores"]


def flat_scores(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """{"bench/supertune_corpus/acc": 0.61, ...}: one metric name per task and metric."""
    return {f"bench/{task}/{metric}": value for task, row in scores.items() for metric, value in row.items()}


def record_scores(run: RunDir, record: dict[str, Any]) -> None:
    """Append `record` ({"step", "model", "scores", ...}) to benchmarks.jsonl and rewrite benchmarks.md.
    An append of one line keeps every earlier evaluation whatever happens to this one."""
    with Path(run.benchmarks).open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    table = scores_table(read_records(run.benchmarks))
    tmp = run.benchmarks_table.with_name(f".{run.benchmarks_table.name}.tmp")
    tmp.write_text(table, encoding="utf-8")
    tmp.replace(run.benchmarks_table)


def scores_table(records: list[dict[str, Any]]) -> str:
    """A markdown table: a row per evaluation (its step or round, and the model), a column per task and metric."""
    columns = sorted({(t, m) for r in records for t, row in r.get("scores", {}).items() for m in row})
    head = ["when", "model", *(f"{t} {m}" for t, m in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [_when(r), f"`{r.get('model', '')}`"]
        cells += [_number(r.get("scores", {}).get(t, {}).get(m)) for t, m in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _when(record: dict[str, Any]) -> str:
    if record.get("round") is not None:
        return f"round {record['round']}"
    return f"step {record['step']}" if record.get("step") is not None else "saved model"


def _number(value: Any) -> str:
    return "" if value is None else f"{value:.4f}"
