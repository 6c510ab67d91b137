"""Batches of preference rows for the model: padded (the default), or packed with document masks
(data.packing and data.document_mask).

A batch of pairs is one batch of sequences: the chosen answers first, the rejected ones after them,
so that one forward pass scores both; a KTO batch holds the answers, and beside them (`kl_input_ids`,
...) each prompt with the answer of the next row (supertune.training_data.preference_data). Labels
are -100 on prompts and padding, as a causal LM's batch has them.

Padded, each sequence is a row padded to the longest of the batch (`attention_mask` marks the
padding), as TRL's default collator does. On pairs of different lengths most of such a batch can be
padding, which the model computes all the same.

Packed, the sequences are laid end to end in rows with the block-diagonal layout of document-masked
SFT packing (supertune.training_data.document_bins.packed_row): position ids restart at 0 for each
sequence, no attention mask (so the model builds the block-diagonal causal mask from the restarts,
supertune.modeling.packed_attention), and -100 at each sequence's first token. A pair's chosen and
rejected sequences share a row; whole pairs (KTO: rows) fill rows of up to data.block_size tokens,
best-fit decreasing. A pair longer than data.block_size is never cut (its answers would be): the
batch's rows are then as long as it, and the other pairs fill them up to that length. The rows are
padded to the longest row of the batch, not to block_size, so a batch of short pairs is not
stretched. `sequence_ids` says which sequence each
token is (-1 on padding), so each answer's summed log-probability is read back per sequence
(supertune.train.preference.preference_losses.sequence_logps), and `sequence_lengths` (first in the
batch: the Trainer's evaluation weighs a batch's loss by the length of its first tensor, which is
then the number of sequences either way) gives their count.

The same pairs give the same batch of pairs either way: training.per_device_train_batch_size counts
pairs, and packing changes only how they are laid out, so the losses are those of the padded batch
(to 1e-6 in float32, tests/test_preference_packing.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..conversations.preference import EncodedAnswer
from .document_bins import IGNORE_INDEX, best_fit_decreasing, packed_row

__all__ = ["PackedPreferenceCollator", "PreferenceCollator", "sequence_count"]


class PreferenceCollator:
    """Pads a batch of PreferenceRows items, one sequence a row, to its longest sequence (see the module)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def padded(self) -> PreferenceCollator:
        """The padded collator of the same rows. The reference log-probabilities are computed once with
        it whatever the run's layout, so their numbers do not depend on data.packing."""
        return PreferenceCollator(self.pad_token_id)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        first = [item["first"] for item in items]
        second = [item["second"] for item in items]
        if "desirable" not in items[0]:
            batch = self._layout(first + second, [[i, len(items) + i] for i in range(len(items))])
            if "reference" in items[0]:
                reference = np.stack([item["reference"] for item in items])
                batch["ref_logps"] = torch.from_numpy(np.concatenate([reference[:, 0], reference[:, 1]]))
            return batch
        alone = [[i] for i in range(len(items))]
        batch = self._layout(first, alone)
        batch.update({f"kl_{k}": v for k, v in self._layout(second, alone).items()})
        batch["desirable"] = torch.tensor([item["desirable"] for item in items], dtype=torch.bool)
        if "reference" in items[0]:
            reference = torch.from_numpy(np.stack([item["reference"] for item in items]))
            batch["ref_logps"], batch["ref_kl_logps"] = reference[:, 0].contiguous(), reference[:, 1].contiguous()
        return batch

    def _layout(self, answers: list[EncodedAnswer], groups: list[list[int]]) -> dict[str, torch.Tensor]:
        """The model's batch of `answers`, one row each, padded to the longest (`groups`, the indices of
        the sequences a packed layout keeps in one row, are for PackedPreferenceCollator)."""
        length = max(len(a.ids) for a in answers)
        ids = torch.full((len(answers), length), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(answers), length), dtype=torch.long)
        labels = torch.full((len(answers), length), IGNORE_INDEX, dtype=torch.long)
        for row, a in enumerate(answers):
            n = len(a.ids)
            ids[row, :n] = torch.from_numpy(a.ids.astype(np.int64))
            attention[row, :n] = 1
            labels[row, :n] = torch.where(torch.from_numpy(a.mask == 1), ids[row, :n], IGNORE_INDEX)
        return {"input_ids": ids, "attention_mask": attention, "labels": labels}


class PackedPreferenceCollator(PreferenceCollator):
    """Packs a batch of PreferenceRows items into document-masked rows of up to `block_size` tokens
    (see the module)."""

    def __init__(self, pad_token_id: int, block_size: int) -> None:
        super().__init__(pad_token_id)
        self.block_size = block_size

    def _layout(self, answers: list[EncodedAnswer], groups: list[list[int]]) -> dict[str, torch.Tensor]:
        sizes = [sum(len(answers[j].ids) for j in g) for g in groups]
        # A pair longer than the block makes every row of the batch as long as it (the batch is one
        # tensor), so the rows are filled up to that length: slots that would be padding anyway.
        width = max(self.block_size, *sizes)
        bins = best_fit_decreasing(sizes, width)
        width = max(sum(sizes[k] for k in b) for b in bins)
        rows = []
        sequence_ids = torch.full((len(bins), width), -1, dtype=torch.long)
        for r, b in enumerate(bins):
            order = [j for k in b for j in groups[k]]
            lengths = torch.tensor([len(answers[j].ids) for j in order])
            pieces = [answers[j].ids.astype(np.int64) for j in order]
            rows.append(packed_row(pieces, width, self.pad_token_id, [answers[j].mask for j in order]))
            sequence_ids[r, : int(lengths.sum())] = torch.repeat_interleave(torch.tensor(order), lengths)
        return {
            "sequence_lengths": torch.tensor([len(a.ids) for a in answers], dtype=torch.long),
            "input_ids": torch.stack([row["input_ids"] for row in rows]),
            "position_ids": torch.stack([row["position_ids"] for row in rows]),
            "labels": torch.stack([row["labels"] for row in rows]),
            "sequence_ids": sequence_ids,
        }


def sequence_count(batch: dict[str, Any], prefix: str = "") -> int:
    """The sequences of a batch (`prefix` "kl_": of its KL rows), padded or packed."""
    lengths = batch.get(f"{prefix}sequence_lengths")
    return int(lengths.shape[0]) if lengths is not None else int(batch[f"{prefix}input_ids"].shape[0])
