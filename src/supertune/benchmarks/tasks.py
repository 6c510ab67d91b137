"""Which lm-evaluation-harness tasks a run asks for, and the harness's TaskManager that finds them.

A task is named three ways: the project's embedded group (`supertune_corpus` and its three tasks,
questions on the embedded corpus built offline: supertune.embedded.corpus_task), a task YAML file (a path ending in .yaml, with its own local data files),
or a task or group of the harness (`hellaswag`, `arc_easy`, ...). Indexing the harness's ~15,000
task and group names takes about 17 s on a CPU, so the index is built only when a name of the
third kind is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..embedded.corpus_task import CORPUS_TASK, KINDS, corpus_task_dir
from ..errors import UserError

__all__ = ["EMBEDDED_TASKS", "is_task_file", "task_manager"]

EMBEDDED_TASKS = (CORPUS_TASK, *(f"{CORPUS_TASK}_{kind}" for kind in KINDS))
"""The tasks the project makes itself, offline."""


def is_task_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def task_manager(tasks: list[str], option: str) -> Any:
    """A TaskManager that knows every name of `tasks`; an unknown name or a missing task file is one
    UserError naming `option` (the CLI option or config key that gave them)."""
    from lm_eval.tasks import TaskManager

    missing = [t for t in tasks if is_task_file(t) and not Path(t).expanduser().is_file()]
    if missing:
        raise UserError(f"{option}: no task file {', '.join(missing)}: give the path of a harness task YAML")
    harness = [t for t in tasks if t not in EMBEDDED_TASKS and not is_task_file(t)]
    manager = TaskManager(include_path=[str(corpus_task_dir())], include_defaults=bool(harness))
    unknown = [t for t in harness if t not in manager.all_tasks]
    if unknown:
        raise UserError(
            f"{option}: unknown task {', '.join(unknown)}: name a task or group of lm-evaluation-harness "
            f"(`lm-eval ls tasks` lists them), a task YAML file, or the embedded {', '.join(EMBEDDED_TASKS)}"
        )
    return manager
