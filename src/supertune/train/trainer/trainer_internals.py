"""The private parts of transformers' Trainer that supertune relies on, in one table.

`GuardedTrainer` overrides some of them and `train.run` calls one; a transformers release that
renames a method, changes its parameters or stops calling it from where supertune expects would
silently switch supertune's checkpoints or NaN checks off. `internals_problems()` compares the
installed Trainer with this table (the test suite asserts it is empty, and each training process
logs a warning when it is not). Tested with transformers 5.23.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

__all__ = ["TrainerInternal", "TRAINER_INTERNALS", "internals_problems"]


@dataclass(frozen=True)
class TrainerInternal:
    name: str
    parameters: tuple[str, ...]
    """Parameter names after self, in order."""
    why: str
    called_from: tuple[str, ...] = ()
    """Trainer methods whose source must call it (self.NAME(), or super()'s), for the override to take effect."""


TRAINER_INTERNALS = (
    TrainerInternal(
        "_save_checkpoint", ("model", "trial"), "checkpoints are staged, hashed and published by supertune"
    ),
    TrainerInternal(
        "_get_output_dir", ("trial",), "points the Trainer's save at the staging directory", ("_save_checkpoint",)
    ),
    TrainerInternal(
        "_save_optimizer_and_scheduler", ("output_dir",), "the save.weights fault point", ("_save_checkpoint",)
    ),
    TrainerInternal(
        "save_model",
        ("output_dir", "_internal_call"),
        "under fsdp a checkpoint's model and optimizer are written as each rank's shards",
        ("_save_checkpoint",),
    ),
    TrainerInternal(
        "_load_optimizer_and_scheduler",
        ("checkpoint",),
        "under fsdp the optimizer state is read from each rank's shards",
        ("_prepare_for_training",),
    ),
    TrainerInternal("training_step", ("model", "inputs", "num_items_in_batch"), "a non-finite loss stops the run"),
    TrainerInternal("_get_grad_norm", ("model", "grad_norm"), "a non-finite gradient norm stops the run"),
    # Referenced, not called, by the training loop (`sync_context = self._defer_fsdp_gradient_reduction`).
    TrainerInternal(
        "_defer_fsdp_gradient_reduction",
        (),
        "gradient accumulation under fsdp reduces once per step (supertune.distributed.fsdp)",
    ),
    TrainerInternal(
        "compute_loss",
        ("model", "inputs", "return_outputs", "num_items_in_batch"),
        "a preference objective's loss replaces the model's own (supertune.train.preference.preference_trainer)",
        ("training_step",),
    ),
    TrainerInternal(
        "prediction_step",
        ("model", "inputs", "prediction_loss_only", "ignore_keys"),
        "a preference objective evaluates with its own loss and metrics",
        ("evaluation_loop",),
    ),
    TrainerInternal(
        "log",
        ("logs", "start_time"),
        "a preference objective's metrics join the logged loss",
        ("_maybe_log_save_evaluate", "evaluate"),
    ),
    TrainerInternal(
        "_load_from_checkpoint",
        ("resume_from_checkpoint", "model"),
        "loads a checkpoint written at the last step without training",
    ),
)


def internals_problems() -> list[str]:
    """One line per difference between the installed Trainer and TRAINER_INTERNALS (empty: none)."""
    import transformers
    from transformers import Trainer

    problems = []
    for internal in TRAINER_INTERNALS:
        method = getattr(Trainer, internal.name, None)
        where = f"transformers {transformers.__version__}: Trainer.{internal.name}"
        if method is None:
            problems.append(f"{where} no longer exists; supertune uses it because {internal.why}")
            continue
        params = tuple(inspect.signature(method).parameters)[1:]
        if params[: len(internal.parameters)] != internal.parameters:
            problems.append(f"{where} now takes {params}, supertune expects {internal.parameters} ({internal.why})")
        for caller in internal.called_from:
            source = inspect.getsource(getattr(Trainer, caller))
            if f".{internal.name}(" not in source:
                problems.append(
                    f"{where} is no longer called by Trainer.{caller}, so supertune's override has no effect ({internal.why})"
                )
    return problems
