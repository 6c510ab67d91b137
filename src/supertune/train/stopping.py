"""Stopping a run on purpose (SIGUSR1, SIGTERM, a stop-request file) and on a broken loss.

A request to stop, from SLURM before a time limit or at preemption, or from a user, makes every
rank finish its current optimizer step; the run then saves a checkpoint and ends, and running the
same command again resumes from it. Signals reach the processes in several ways (the batch shell
only, every task, a launcher agent that may or may not forward them), so the job script and
`supertune train --nproc N` turn a signal into the file <run dir>/stop-request as well: the main
process looks for it once per step (one stat call).

Whether any rank wants to stop, or has seen a NaN/Inf loss or gradient norm, is agreed on by one
all_reduce of two numbers per optimizer step, so all ranks stop at the same step. The Trainer
already reads the loss on the host every step (its NaN filter), so the check adds no new sync.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from ..checkpoints.faults import fault_point
from ..errors import UserError
from ..rundir import RunDir
from .signals import received_signal

__all__ = ["NonFiniteLoss", "RunGuard"]

log = logging.getLogger("supertune")


class NonFiniteLoss(UserError):
    """The loss or gradient norm became NaN or Inf."""


class RunGuard(TrainerCallback):
    """After every optimizer step: stop on request (checkpoint first), or fail on a non-finite loss."""

    def __init__(self, run: RunDir, rank: int, last_checkpoint: Any) -> None:
        self.stop_file = run.stop_request
        self.rank = rank
        self.is_main = rank == 0
        self.last_checkpoint = last_checkpoint  # () -> name of the newest published checkpoint, or None
        self.nonfinite_step = 0
        self.nonfinite_what = ""
        self.stopped: str | None = None
        """Why the run stopped early (a signal name, or the stop-request file); None while it runs."""

    def note_nonfinite(self, step: int, what: str) -> None:
        if not self.nonfinite_step:
            self.nonfinite_step = step
            self.nonfinite_what = what

    def _local_request(self) -> str | None:
        if received_signal():
            return received_signal()
        if self.is_main and self.stop_file.exists():
            return f"a stop request ({self.stop_file.name})"
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        fault_point("step", state.global_step, self.rank)
        request = self._local_request()
        wants_stop, nonfinite = _agree(1 if request else 0, self.nonfinite_step, args.device)
        if nonfinite:
            last = self.last_checkpoint()
            keep = f"the last good checkpoint is {last}" if last else "no checkpoint was saved before it"
            raise NonFiniteLoss(
                f"training: {self.nonfinite_what or 'the loss or gradient norm (of another rank)'} became NaN or Inf at step {nonfinite}; "
                f"the run stopped without saving that step, and {keep}. "
                "Lower training.learning_rate, raise training.warmup_steps or check the data, then start a new run"
            )
        if wants_stop and self.stopped is None:
            self.stopped = request or "a stop request on another rank"
            control.should_save = True
            control.should_training_stop = True


def _agree(stop: int, nonfinite_step: int, device: Any) -> tuple[int, int]:
    """The maximum of both numbers over all ranks (the numbers themselves in a single process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return stop, nonfinite_step
    flags = torch.tensor([stop, nonfinite_step], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return int(flags[0]), int(flags[1])
