"""Stopping a run on purpose (SIGUSR1, SIGTERM, a stop-request file) and on a broken loss.

A request to stop, from SLURM before a time limit or at preemption, or from a user, makes every
rank finish its current optimizer step; the run then saves a checkpoint and ends, and running the
same command again resumes from it. Signals reach the processes in several ways (the batch shell
only, every task, a launcher agent that may or may not forward them), so the job script and
`supertune train --nproc N` turn a signal into the file <run dir>/stop-request as well: the main
process looks for it once per step (one stat call).

Whether any rank wants to stop, or has seen a NaN/Inf loss or gradient norm, is agreed on by one
all_reduce of two numbers per optimizer step, so all ranks stop at the same step. The losses of the
micro-batches and the step's gradient norm are checked on their device (`watch`: a flag kept there,
no copy to the host), and the flag is read once, at the end of the optimizer step, inside that
agreement: one device-to-host read per optimizer step in all, where reading each loss and the norm
as it came cost one per micro-batch and one more per step.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import TrainerCallback

from ...checkpoints.faults import fault_point
from ...errors import UserError
from ...rundir import RunDir
from .signals import received_signal

__all__ = ["NonFiniteLoss", "RunGuard"]

log = logging.getLogger("supertune")


class NonFiniteLoss(UserError):
    """The loss or gradient norm became NaN or Inf."""


# What became NaN or Inf, as the flag on the device holds it; the larger wins, and the loss comes
# before the gradient norm in a step.
_GRADIENT_NORM = 1
_LOSS = 2
_NONFINITE = {_LOSS: "the loss", _GRADIENT_NORM: "the gradient norm"}


class RunGuard(TrainerCallback):
    """After every optimizer step: stop on request (checkpoint first), or fail on a non-finite loss."""

    def __init__(self, run: RunDir, rank: int, last_checkpoint: Any) -> None:
        self.stop_file = run.stop_request
        self.rank = rank
        self.is_main = rank == 0
        self.last_checkpoint = last_checkpoint  # () -> name of the newest published checkpoint, or None
        self.nonfinite: Any = 0
        """What became NaN or Inf in this optimizer step (_LOSS, _GRADIENT_NORM; 0: nothing): a tensor
        on the values' device once one is watched, so that checking costs no copy to the host."""
        self.stopped: str | None = None
        """Why the run stopped early (a signal name, or the stop-request file); None while it runs."""

    def watch_loss(self, loss: Any) -> None:
        """Check a micro-batch's loss at the end of this optimizer step."""
        self._watch(loss, _LOSS)

    def watch_gradient_norm(self, norm: Any) -> None:
        """Check the step's gradient norm at the end of this optimizer step."""
        self._watch(norm, _GRADIENT_NORM)

    def _watch(self, value: Any, what: int) -> None:
        import torch

        if isinstance(value, torch.Tensor):
            if hasattr(value, "full_tensor"):  # a DTensor norm (fsdp): the whole, as float() took it before
                value = value.full_tensor()
            flag: Any = torch.where(torch.isfinite(value.detach()), 0, what).reshape(())
        else:  # DeepSpeed hands the norm over as a float
            flag = 0 if math.isfinite(float(value)) else what
        before = self.nonfinite
        if isinstance(before, int) and isinstance(flag, int):
            self.nonfinite = max(before, flag)
        elif isinstance(before, int):
            self.nonfinite = flag.clamp(min=before) if before else flag
        else:
            self.nonfinite = before.clamp(min=flag) if isinstance(flag, int) else torch.maximum(before, flag)

    def _local_request(self) -> str | None:
        if received_signal():
            return received_signal()
        if self.is_main and self.stop_file.exists():
            return f"a stop request ({self.stop_file.name})"
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        fault_point("step", state.global_step, self.rank)
        request = self._local_request()
        mine = self.nonfinite
        wants_stop, nonfinite = _agree(1 if request else 0, mine, args.device)
        self.nonfinite = 0
        if nonfinite:
            what = _NONFINITE.get(int(mine), "the loss or gradient norm (of another rank)")
            last = self.last_checkpoint()
            keep = f"the last good checkpoint is {last}" if last else "no checkpoint was saved before it"
            raise NonFiniteLoss(
                f"training: {what} became NaN or Inf at step {state.global_step}; "
                f"the run stopped without saving that step, and {keep}. "
                "Lower training.learning_rate, raise training.warmup_steps or check the data, then start a new run"
            )
        if wants_stop and self.stopped is None:
            self.stopped = request or "a stop request on another rank"
            control.should_save = True
            control.should_training_stop = True


def _agree(stop: int, nonfinite: Any, device: Any) -> tuple[int, int]:
    """The maximum of both over all ranks (themselves in a single process); `nonfinite` may be a
    tensor on the device, read here once: the one device-to-host copy of the step's checks."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return stop, int(nonfinite)
    flags = torch.stack(
        [
            torch.tensor(stop, dtype=torch.int64, device=device),
            torch.as_tensor(nonfinite, device=device).to(torch.int64),
        ]
    )
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stop_all, nonfinite_all = flags.tolist()  # one copy to the host for both
    return int(stop_all), int(nonfinite_all)
