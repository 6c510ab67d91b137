"""training.objective checked against the rest of a run config: its knobs (supertune.config.objectives)
and what the preference objectives cannot read yet. Called by supertune.config.validate."""

from __future__ import annotations

from .objectives import KNOB_DEFAULTS, OBJECTIVES, objective_problems
from .schema import RunConfig

__all__ = ["PREFERENCE_STRATEGIES", "objective_config_problems"]

PREFERENCE_STRATEGIES = ("ddp", "fsdp")
"""Where the preference objectives are held equal to one process (tests/test_preference_distributed.py);
DeepSpeed's ZeRO stages are not yet, so they are refused."""


def objective_config_problems(cfg: RunConfig) -> list[str]:
    """training.objective and its knobs; what the preference objectives cannot read yet."""
    t, d = cfg.training, cfg.data
    p = objective_problems(t.objective, {name: getattr(t, name) for name in KNOB_DEFAULTS})
    if t.objective not in OBJECTIVES or OBJECTIVES[t.objective].rows == "text":
        return p
    why = f"training.objective={t.objective} reads its rows from files, a hub dataset or the embedded pairs"
    if d.store:
        p.append(f"data.store: {why}; a token store of preference rows is not supported yet, give data.train_files")
    if d.streaming:
        p.append(f"data.streaming: {why} into memory; set data.streaming=false")
    if d.format == "prompt_completion":
        p.append(
            f"data.format: training.objective={t.objective} reads preference rows, not prompt/completion rows; leave data.format out"
        )
    if cfg.distributed.strategy not in PREFERENCE_STRATEGIES:
        p.append(
            f"distributed.strategy: training.objective={t.objective} runs under ddp or fsdp only for now "
            f"(got {cfg.distributed.strategy}); choose one of those"
        )
    return p
