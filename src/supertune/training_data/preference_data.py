"""The datasets of a preference run (training.objective dpo, orpo, simpo, kto): rows read, encoded
and checked, then served in batches padded to their longest sequence, or packed with document masks
(supertune.training_data.preference_batches).

A row is a pair (chosen, rejected), or for KTO an answer with its label and its KL row: its prompt
with the answer of the next row, the mismatched pairs whose log-probability ratio estimates the KL
divergence the loss measures against.

The reference model's log-probabilities, when computed once before training
(supertune.train.preference.preference_reference), are kept with the rows (`PreferenceRows.reference`) and
travel with each batch as `ref_logps` (and `ref_kl_logps`), so a run holds one model.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..config.objectives import OBJECTIVES
from ..config.schema import DataConfig
from ..conversations.preference import EncodedAnswer, encode_pairs, encode_unpaired
from ..documents.encoding import iter_row_batches
from ..documents.sources import load_raw_splits
from ..errors import UserError
from .pipeline import TrainingData
from .preference_batches import PackedPreferenceCollator, PreferenceCollator

__all__ = ["PackedPreferenceCollator", "PreferenceCollator", "PreferenceRows", "build_preference_data"]

log = logging.getLogger("supertune")


class PreferenceRows(torch.utils.data.Dataset):
    """Encoded preference rows: pairs (chosen, rejected), or unpaired answers with their labels and
    KL rows (each prompt with the next row's answer)."""

    def __init__(
        self,
        first: list[EncodedAnswer],
        second: list[EncodedAnswer],
        desirable: np.ndarray | None = None,
    ) -> None:
        self.first = first
        """The chosen answers, or the unpaired answers."""
        self.second = second
        """The rejected answers, or the KL rows."""
        self.desirable = desirable
        """Unpaired rows: whether each answer is desirable; None for pairs."""
        self.reference: np.ndarray | None = None
        """Rows x 2 float64 log-probabilities of the reference model (first, second), once computed."""

    @classmethod
    def unpaired(cls, answers: list[EncodedAnswer], desirable: list[bool]) -> PreferenceRows:
        """Unpaired rows with their KL rows: row i's prompt with row i+1's answer (the last row's with
        the first's), mismatched, and the same rows in every epoch and on every process, so that the
        reference's log-probabilities of them can be computed once."""
        kl = [_spliced(answers[i], answers[(i + 1) % len(answers)]) for i in range(len(answers))]
        return cls(answers, kl, np.asarray(desirable, dtype=bool))

    @property
    def paired(self) -> bool:
        return self.desirable is None

    def __len__(self) -> int:
        return len(self.first)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        item: dict[str, Any] = {"first": self.first[i], "second": self.second[i]}
        if self.desirable is not None:
            item["desirable"] = bool(self.desirable[i])
        if self.reference is not None:
            item["reference"] = self.reference[i]
        return item

    @property
    def num_tokens(self) -> int:
        return int(sum(len(a.ids) for a in self.first) + (sum(len(a.ids) for a in self.second) if self.paired else 0))

    @property
    def loss_tokens(self) -> int:
        """Answer tokens the loss reads (the KL rows' are only scored)."""
        answers = self.first + self.second if self.paired else self.first
        return int(sum(int(a.mask.sum()) for a in answers))

    def longest(self) -> int:
        return max(len(a.ids) for a in self.first + self.second)


def build_preference_data(
    d: DataConfig, objective: str, tokenizer: Any, seed: int, context_length: int
) -> TrainingData:
    """Load, encode and check the rows of training.objective (pairs or unpaired), as TrainingData."""
    unpaired = OBJECTIVES[objective].rows == "unpaired"
    shape = "{prompt, completion, label}" if unpaired else "{prompt, chosen, rejected}"
    fix = f"training.objective={objective} reads {shape} rows: give such data, or name the column that holds it"
    raw = load_raw_splits(d, seed, embedded=_embedded(unpaired), needed=_needed(d, unpaired), needed_fix=fix)
    train = _encode_split(raw.train, d, tokenizer, "the training split", unpaired)
    validation = _encode_split(raw.validation, d, tokenizer, "the validation split", unpaired)
    if not len(train) or not len(validation):
        empty = "training" if not len(train) else "validation"
        raise UserError(f"data: the {empty} split holds no preference rows; check data.train_files")
    limit = d.max_length or min(max(train.longest(), validation.longest()), context_length)
    for rows, where in ((train, "the training split"), (validation, "the validation split")):
        _check_lengths(rows, limit, where, d.max_length is not None)
    if unpaired:
        _check_labels(train)
    log.info(
        "%s: %d training and %d validation %s, %d tokens, %d of them answers (the loss reads those)",
        objective,
        len(train),
        len(validation),
        "unpaired rows" if unpaired else "pairs",
        train.num_tokens,
        train.loss_tokens,
    )
    return TrainingData(
        train=train,
        validation=validation,
        collator=_collator(d, tokenizer.pad_token_id),
        max_length=limit,
        train_tokens_available=train.num_tokens,
        unigram_perplexity=None,
        loss_tokens_available=train.loss_tokens,
    )


def _collator(d: DataConfig, pad_token_id: int) -> PreferenceCollator:
    """Pairs packed with document masks under data.packing and data.document_mask, else padded
    (data.packing alone packs nothing here: without the mask a rejected answer would attend to the
    chosen one before it)."""
    if d.packing and d.document_mask:
        return PackedPreferenceCollator(pad_token_id, d.block_size)
    return PreferenceCollator(pad_token_id)


def _embedded(unpaired: bool) -> Any:
    from ..embedded import preference_corpus

    return preference_corpus().splits(unpaired)


def _needed(d: DataConfig, unpaired: bool) -> list[tuple[str, str]]:
    if unpaired:
        return [("data.completion_field", d.completion_field), ("data.label_field", d.label_field)]
    return [("data.chosen_field", d.chosen_field), ("data.rejected_field", d.rejected_field)]


def _encode_split(dataset: Any, d: DataConfig, tokenizer: Any, where: str, unpaired: bool) -> PreferenceRows:
    first: list[EncodedAnswer] = []
    second: list[EncodedAnswer] = []
    labels: list[bool] = []
    for rows in iter_row_batches(dataset):
        if unpaired:
            for answer, label in encode_unpaired(rows, d, tokenizer, where, len(first)):
                first.append(answer)
                labels.append(label)
        else:
            for chosen, rejected in encode_pairs(rows, d, tokenizer, where, len(first)):
                first.append(chosen)
                second.append(rejected)
    return PreferenceRows.unpaired(first, labels) if unpaired else PreferenceRows(first, second)


def _spliced(prompt_of: EncodedAnswer, answer_of: EncodedAnswer) -> EncodedAnswer:
    """The prompt tokens of one row followed by the answer tokens of another (answers end a row)."""
    head = prompt_of.ids[prompt_of.mask == 0]
    tail = answer_of.ids[answer_of.mask == 1]
    mask = np.concatenate([np.zeros(len(head), np.uint8), np.ones(len(tail), np.uint8)])
    return EncodedAnswer(np.concatenate([head, tail]).astype(np.int32), mask)


def _check_lengths(rows: PreferenceRows, limit: int, where: str, configured: bool) -> None:
    """A pair (or row) longer than a sequence is refused: cutting it would cut its answer, and the
    loss would compare what is left of two answers instead of the answers."""
    fix = "raise data.max_length" if configured else "the model has no more positions"
    for i in range(len(rows)):
        sides = (rows.first[i], rows.second[i]) if rows.paired else (rows.first[i],)
        longest = max(len(a.ids) for a in sides)
        if longest > limit:
            kind = "pair" if rows.paired else "row"
            raise UserError(
                f"data.max_length: row {i} of {where} (counting from 0): the {kind} is {longest} tokens, longer than "
                f"{limit}; {fix}, shorten the row or drop it"
            )


def _check_labels(rows: PreferenceRows) -> None:
    good = int(rows.desirable.sum()) if rows.desirable is not None else 0
    if good in (0, len(rows)):
        held = "desirable (true)" if good else "undesirable (false)"
        raise UserError(
            f"data.label_field: every training row of training.objective=kto is {held}; KTO weighs desirable "
            "against undesirable answers and needs both, so add rows of the other label"
        )
