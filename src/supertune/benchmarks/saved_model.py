"""`supertune eval MODEL --tasks ...`: benchmarks of a saved model, recorded where the model belongs.

- a run's model (<run dir>/model): into the run directory, and into the run's tracked W&B and MLflow
  runs (training.report_to; the same runs its training logged to, through tracking.json);
- a federation's global model (<federation dir>/round-NNN/global): into the federation directory,
  marked with the round;
- any other saved model: into the model directory itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..config.schema import EvaluationConfig
from ..errors import first_line
from ..rundir import RunDir, run_of_model
from .results import flat_scores

__all__ = ["benchmark_saved_model", "scores_owner"]

_ROUND = re.compile(r"round-(\d{3,})")


def scores_owner(model_dir: Path) -> tuple[RunDir, dict[str, Any], RunDir | None]:
    """(where the records go, what marks the record, the run whose tracked runs get the scores)."""
    run = run_of_model(model_dir)
    if run is not None:
        return run, {}, run
    parent = model_dir.parent
    found = _ROUND.fullmatch(parent.name)
    if model_dir.name == "global" and found and (parent.parent / "federation.yaml").is_file():
        return RunDir(parent.parent), {"round": int(found.group(1))}, None
    return RunDir(model_dir), {}, None


def benchmark_saved_model(
    model_dir: str,
    tasks: list[str],
    e: EvaluationConfig,
    verify: str = "auto",
    option: str = "--tasks",
    tokenizer: str | None = None,
) -> tuple[dict[str, dict[str, float]], Path, list[str]]:
    """(scores, the benchmarks.md written, a warning per tracking sink that could not take them);
    option: the CLI option or config key that named the tasks, for its errors; tokenizer: the
    model.tokenizer to use when the model directory holds none (default: its run's or its
    federation's sites', as `supertune eval` does for perplexity)."""
    from ..checkpoints.model_files import has_tokenizer_files
    from ..evaluation.perplexity import load_saved_model
    from .scoring import check_tasks, record, score_model  # transformers: not for scores_owner's callers

    path = Path(model_dir).expanduser().absolute()
    manager = check_tasks(tasks, option)  # a wrong name or missing data before the model loads
    owner, where, run = scores_owner(path)
    if path.is_dir() and not has_tokenizer_files(path):
        tokenizer = tokenizer or _configured_tokenizer(owner, run)
    else:
        tokenizer = None  # the model's own tokenizer wins
    model, loaded = load_saved_model(str(path), verify, tokenizer)
    scores = score_model(model, loaded, e, tasks, option, manager)
    step = _trained_steps(run)
    record(owner, scores, step=step, model=str(path), **where)
    warnings = _track(run, step or 0, flat_scores(scores)) if run is not None else []
    return scores, owner.benchmarks_table, warnings


def _configured_tokenizer(owner: RunDir, run: RunDir | None) -> str | None:
    """model.tokenizer of the model's run, or of its federation's first site (sites/<name>.yaml: the
    sites of a federation share their tokenizer); None when there is none to name."""
    from ..config import read_config_file

    if run is not None:
        configs = [run.config]
    else:
        configs = sorted((owner.path / "sites").glob("*.yaml"))[:1]
    for config in configs:
        try:
            value = read_config_file(config).get("model", {}).get("tokenizer")
        except Exception:  # an unreadable config names no tokenizer; the model's own check says what is missing
            return None
        return value if isinstance(value, str) and value not in ("", "train") else None
    return None


def _trained_steps(run: RunDir | None) -> int | None:
    if run is None:
        return None
    try:
        summary = run.read_summary(str(run.summary))
    except Exception:  # a damaged summary only loses the step number of this record
        return None
    steps = (summary or {}).get("train_steps")
    return steps if isinstance(steps, int) else None


def _track(run: RunDir, step: int, scores: dict[str, float]) -> list[str]:
    """The scores into the run's tracked runs (the sinks its config names), at its last step."""
    from ..config import load_saved_config
    from ..launch.environment import launch_environment
    from ..tracking.session import SINKS, Tracking

    try:
        cfg = load_saved_config(run.config)
    except Exception as exc:  # the scores are recorded already; a config that no longer loads only skips tracking
        return [f"{run.config} could not be read ({first_line(exc)}): the scores were not sent to W&B or MLflow"]
    if not any(s in SINKS for s in cfg.training.report_to):
        return []
    tracking = Tracking.for_run(cfg, run, launch_environment(), "saved model")
    tracking.log(step, scores)
    tracking.close("finished", step)
    return []
