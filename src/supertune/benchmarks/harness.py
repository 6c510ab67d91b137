"""Run lm-evaluation-harness tasks on a loaded model, through its Python API (HFLM wraps the model
and tokenizer as they are: no second load, no copy of the weights).

A task whose dataset is not in the local Hugging Face datasets cache fails while the harness builds
it; on an offline compute node that is one UserError naming the task and the command that
downloads its data, run where there is internet (a login node).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import UserError, first_line
from .tasks import is_task_file, task_manager

__all__ = ["load_each", "run_tasks", "scores_of"]

log = logging.getLogger("supertune")

# The harness logs every request batch and sample at INFO; a training's log keeps supertune's lines.
_QUIET = ("lm_eval", "lm-eval")


def run_tasks(
    model: Any,
    tokenizer: Any,
    tasks: list[str],
    option: str,
    batch_size: int,
    limit: int | None = None,
    manager: Any = None,
) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for every task (and group) of `tasks`; limit: the first N documents
    of each task (None: all); manager: the TaskManager check_tasks made, else one is made here."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    if manager is None:
        manager = task_manager(tasks, option)
        load_each(manager, tasks, option)
    was_training = model.training
    lm = _quiet(HFLM)(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    try:
        out = simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            log_samples=False,
            bootstrap_iters=0,  # standard errors by bootstrap cost seconds per metric; the scores do not need them
            verbosity="WARNING",
        )
    finally:
        model.train(was_training)  # HFLM puts the model in eval mode; a training goes on after it
    return scores_of(out)


def _quiet(hflm: type) -> type:
    """HFLM without its progress bars: in a job log they are lines of carriage returns, and supertune
    logs the time and the scores of each evaluation itself."""

    class QuietHFLM(hflm):  # type: ignore[misc, valid-type]
        def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
            return super().generate_until(requests, disable_tqdm=True)

    return QuietHFLM


def load_each(manager: Any, tasks: list[str], option: str) -> None:
    """Build every task once (its data read from the local cache, or downloaded when online), so that
    a task whose data is missing is named alone, with the command that fetches it."""
    for task in tasks:
        try:
            manager.load([task])
        except Exception as exc:  # the harness raises what datasets raises: no one type for "not cached"
            raise UserError(_not_loaded(task, manager, exc, option)) from exc


def scores_of(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The task's metrics (those the harness says are better higher or lower: not sample counts or
    standard errors) of every task and group, 'acc,none' spelled 'acc' (the default filter)."""
    scores: dict[str, dict[str, float]] = {}
    known = out.get("higher_is_better", {})
    for task, metrics in sorted(out.get("results", {}).items()):
        row = {}
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if metric not in known.get(task, {}) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            row[metric if filt in ("", "none") else f"{metric},{filt}"] = float(value)
        scores[task] = row
    return scores


def _not_loaded(task: str, manager: Any, exc: BaseException, option: str) -> str:
    if is_task_file(task):
        import yaml

        try:
            cfg = yaml.safe_load(Path(task).expanduser().read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            cfg = None  # the harness's own reason below says what is wrong with the file
    else:
        cfg = getattr(manager.task_index.get(task), "cfg", None)
    cfg = cfg if isinstance(cfg, dict) else {}
    path, name = cfg.get("dataset_path"), cfg.get("dataset_name")
    reason = f"{type(exc).__name__}: {first_line(exc)[:200]}"
    if not path or path in ("json", "csv", "parquet", "text"):
        return f"{option}: task {task} could not be built ({reason}); check its YAML and data files"
    args = repr(path) if name is None else f"{path!r}, {name!r}"
    return (
        f"{option}: the data of task {task} (dataset {path}{'' if name is None else ' ' + name}) is not in the local "
        f"Hugging Face datasets cache ({reason}): pre-download it where there is internet, with the same HF_HOME: "
        f'HF_DATASETS_OFFLINE=0 python -c "import datasets; datasets.load_dataset({args})"'
    )
