"""Downstream benchmarks: lm-evaluation-harness tasks run on a model, offline from local data.

- `tasks`: which tasks a name means (the embedded supertune_corpus, a task YAML file, a harness task)
  and the harness's TaskManager that finds them.
- `harness`: the harness's Python API (HFLM around the loaded model and tokenizer) and its scores;
  a task whose data is not in the local cache is one error naming the command that fetches it.
- `scoring`: the tasks checked before a training, run after it and every N steps (BenchmarkCallback).
- `results`: benchmarks.jsonl and benchmarks.md in a run directory, and the scores as metric names.
- `saved_model`: `supertune eval MODEL --tasks`, the scores recorded where the model belongs.
- `job`, `job_entry`: the same as a SLURM job (`--submit`), and the entry point that job runs.

Importing this package does not import lm_eval (a run without evaluation.tasks never loads it), nor
transformers: `scoring`'s names are imported when first used, so that rendering a benchmark job
on a login node (`supertune eval --tasks --submit --dry-run`) takes a second, not ten.
"""

from typing import Any

from .results import flat_scores, record_scores, scores_table
from .tasks import EMBEDDED_TASKS

_SCORING = ("LM_EVAL_PIN", "BenchmarkCallback", "check_tasks", "record", "score_model")


def __getattr__(name: str) -> Any:
    if name in _SCORING:
        from . import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EMBEDDED_TASKS",
    "LM_EVAL_PIN",
    "BenchmarkCallback",
    "check_tasks",
    "flat_scores",
    "record",
    "record_scores",
    "score_model",
    "scores_table",
]
