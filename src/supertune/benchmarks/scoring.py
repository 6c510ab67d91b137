"""Benchmarks of a model inside a run: checked before training, run after it and every N steps,
recorded in the run directory, handed to a publisher (metrics.jsonl and the tracking sinks)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from ..config.schema import EvaluationConfig
from ..errors import UserError
from ..rundir import RunDir
from .harness import load_each, run_tasks
from .results import flat_scores, record_scores
from .tasks import task_manager

__all__ = ["BenchmarkCallback", "LM_EVAL_PIN", "check_tasks", "record", "score_model"]

log = logging.getLogger("supertune")

LM_EVAL_PIN = "lm_eval==0.4.13"

Publish = Callable[[int, dict[str, float]], None]
"""(step, {"bench/<task>/<metric>": value}) to metrics.jsonl and the tracking sinks."""


def _harness_installed(option: str) -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"{option}: lm-evaluation-harness is not installed here ({exc}): pip install {LM_EVAL_PIN} "
            "(pinned-requirements.txt; scripts/env.sh installs it)"
        ) from exc


def check_tasks(tasks: list[str], option: str) -> Any:
    """Before a training starts: every task is known and its data is here (a task built once costs a
    second for the embedded one), so a missing dataset is reported before hours of training, not after."""
    _harness_installed(option)
    manager = task_manager(tasks, option)
    load_each(manager, tasks, option)
    return manager


def score_model(
    model: Any, tokenizer: Any, e: EvaluationConfig, tasks: list[str], option: str, manager: Any = None
) -> dict[str, dict[str, float]]:
    """The scores of `tasks` on the model; manager: check_tasks's, when it ran in this process."""
    _harness_installed(option)
    started = time.time()
    scores = run_tasks(model, tokenizer, tasks, option, e.batch_size, e.limit, manager)
    log.info("benchmarks (%.1f s): %s", time.time() - started, _line(scores))
    return scores


def record(run: RunDir, scores: dict[str, dict[str, float]], **where: Any) -> None:
    """One evaluation into benchmarks.jsonl and benchmarks.md; where: step, round, model."""
    record_scores(run, {**where, "scores": scores, "unix_time": round(time.time(), 3)})


def _line(scores: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{name} {value:.4f}" for name, value in flat_scores(scores).items()) or "no scores"


class BenchmarkCallback(TrainerCallback):
    """evaluation.every_steps: the tasks on the main process's model every N optimizer steps (the
    other processes wait in their next step's all-reduce meanwhile)."""

    def __init__(self, e: EvaluationConfig, tokenizer: Any, run: RunDir, publish: Publish) -> None:
        self.e = e
        self.tokenizer = tokenizer
        self.run = run
        self.publish = publish

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        every = self.e.every_steps
        if not every or not state.is_world_process_zero or state.global_step % every or model is None:
            return
        if state.max_steps and state.global_step >= state.max_steps:
            return  # the last step: the run's own evaluation after training scores it
        scores = score_model(model, self.tokenizer, self.e, self.e.tasks, "evaluation.tasks")
        record(self.run, scores, step=state.global_step, model="training")
        self.publish(state.global_step, flat_scores(scores))
