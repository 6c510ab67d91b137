"""The tokens a run trained on: those the loss was computed on, as opposed to the tokens it read.

A causal LM's loss predicts token t+1 from position t, so the targets of a sequence are its labels
shifted by one (`labels[..., 1:]`, or the `shift_labels` a collator gives) that are not -100: the
first token of every sequence, padding, the first token of every document of a document-masked
block, and the tokens data.loss_on leaves out (prompts, the non-assistant turns) are read but not
trained. The transformers Trainer counts the tokens read (`num_input_tokens_seen`); this counts the
targets, in the same micro-batches.

Each process counts its own micro-batches in a tensor on its device (no synchronisation per step);
the counts are summed over the processes (one all-reduce) only when a checkpoint or the summary is
written, which every process reaches together. A resumed run starts from its checkpoint's count, and
the steps after it are the same batches, so an interrupted run counts what an uninterrupted one does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IGNORED_LABEL", "LossTokenCount", "loss_targets"]

IGNORED_LABEL = -100
"""The label the loss skips (transformers' ignore_index)."""


def loss_targets(inputs: Any) -> Any:
    """The number of loss targets in one micro-batch (a 0-d tensor on the batch's device), or None
    when it has no labels."""
    shifted = inputs.get("shift_labels")
    if shifted is None:
        labels = inputs.get("labels")
        if labels is None:
            return None
        shifted = labels[..., 1:]
    return (shifted != IGNORED_LABEL).sum()


class LossTokenCount:
    """Loss targets trained so far: those of the checkpoint the run resumed from, plus this process's own."""

    def __init__(self) -> None:
        self.before: int | None = 0
        """The count at the checkpoint resumed from, over every process (None: a checkpoint written
        before loss tokens were counted, so the total is unknown)."""
        self.here: Any = 0
        """This process's micro-batches since it started (a tensor once the first is counted)."""

    def add(self, inputs: Any) -> None:
        found = loss_targets(inputs)
        if found is not None:
            self.here = self.here + found.detach()

    def resumed_at(self, loss_tokens: int | None) -> None:
        self.before = loss_tokens

    def total(self, accelerator: Any, world_size: int, device: Any) -> int | None:
        """The count over every process: an all-reduce when there are several, so every process must call it."""
        import torch

        here = torch.as_tensor(self.here, dtype=torch.int64, device=device)
        if world_size > 1:
            here = accelerator.gather(here.reshape(1)).sum()
        return None if self.before is None else self.before + int(here.item())
