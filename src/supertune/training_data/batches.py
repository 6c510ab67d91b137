"""Torch datasets of training sequences: packed blocks or padded documents, in memory or streamed.

Packing concatenates documents (EOS between them) into one int32 array and serves fixed blocks as
views of it: no per-block Python lists and no arrow cache writes, which is what makes the first
step come quickly. Padding keeps one array per document and pads in the collator. Packing with
data.document_mask places whole documents into blocks instead (supertune.training_data.document_bins).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config.schema import DataConfig
from ..documents.encode_threads import encode_in_threads
from ..documents.encoding import encode_texts, iter_row_batches, render_texts
from ..documents.sample_checks import check_encoded, check_rows
from ..errors import UserError
from .document_bins import IGNORE_INDEX, DocumentPlan, stream_rows

__all__ = [
    "DocumentMaskedStream",
    "ListDataset",
    "PackedBlocks",
    "PaddedDocuments",
    "PackedStream",
    "PaddedStream",
    "PadCollator",
    "TokenizedSplit",
    "tokenize_split",
]


@dataclass
class TokenizedSplit:
    """All documents of a split as token arrays (EOS appended when configured)."""

    docs: list[np.ndarray]
    masks: list[np.ndarray] | None = None
    """Per document, 1 where a token is a loss target (data.loss_on); None: every token is."""

    @property
    def num_tokens(self) -> int:
        return int(sum(len(x) for x in self.docs))

    def concatenated(self) -> np.ndarray:
        return np.concatenate(self.docs) if self.docs else np.zeros(0, dtype=np.int32)

    def concatenated_mask(self) -> np.ndarray | None:
        if self.masks is None:
            return None
        return np.concatenate(self.masks) if self.masks else np.zeros(0, dtype=np.uint8)

    @property
    def loss_tokens(self) -> int:
        """Tokens the loss is computed on."""
        return self.num_tokens if self.masks is None else int(sum(int(m.sum()) for m in self.masks))

    def offsets(self) -> np.ndarray:
        """Document i is concatenated()[offsets[i]:offsets[i + 1]] (int64, documents + 1 entries), as in a token store."""
        return np.concatenate([[0], np.cumsum([len(x) for x in self.docs], dtype=np.int64)]).astype(np.int64)


def tokenize_split(dataset: Any, d: DataConfig, tokenizer: Any, split: str = "training") -> TokenizedSplit:
    """Render and tokenize a map-style split in batches, on every core (documents/encode_threads.py); the
    first batch is checked for garbage (documents/sample_checks.py) before the rest is read.
    Conversations and prompt/completion rows (data.format) are encoded with their loss masks, every
    row checked (supertune.conversations.encoding)."""
    if d.format != "text":
        return _masked_split(dataset, d, tokenizer, split)
    docs: list[np.ndarray] = []
    batches = ((len(texts), texts) for texts in _rendered(iter_row_batches(dataset), d, split))
    for i, (texts, flat, lengths) in enumerate(encode_in_threads(batches, tokenizer, d.add_eos)):
        if i == 0:
            check_encoded(texts, lengths, d.add_eos, split)
        if len(lengths):
            docs += np.split(flat, np.cumsum(lengths[:-1]))  # views of the batch's array; lengths are positive
    return TokenizedSplit(docs)


def _masked_split(dataset: Any, d: DataConfig, tokenizer: Any, split: str) -> TokenizedSplit:
    from ..conversations.encoding import encode_rows

    docs: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    for rows in iter_row_batches(dataset):
        ids, mask = encode_rows(rows, d, tokenizer, f"the {split} split", len(docs))
        docs += ids
        masks += mask
    return TokenizedSplit(docs, masks)


def _rendered(batches: Iterator[dict[str, list[Any]]], d: DataConfig, split: str) -> Iterator[list[str]]:
    """Each batch of rows rendered into documents; the first batch's rows are checked first."""
    for i, rows in enumerate(batches):
        if i == 0:
            check_rows(rows, d, split)
        yield render_texts(rows, d)


class PackedBlocks(torch.utils.data.Dataset):
    """Fixed-length blocks cut from the concatenated token stream; the remainder is dropped."""

    def __init__(self, tokens: np.ndarray, block_size: int, loss_mask: np.ndarray | None = None) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.loss_mask = loss_mask
        """1 where a token is a loss target, aligned with `tokens` (None: every token is)."""

    def __len__(self) -> int:
        return len(self.tokens) // self.block_size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = i * self.block_size
        ids = torch.from_numpy(self.tokens[start : start + self.block_size].astype(np.int64))
        labels = ids.clone()
        if self.loss_mask is not None:
            labels[torch.from_numpy(self.loss_mask[start : start + self.block_size] == 0)] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}


class PaddedDocuments(torch.utils.data.Dataset):
    """One sequence per document, truncated to max_length; PadCollator pads it."""

    def __init__(self, docs: list[np.ndarray], max_length: int, masks: list[np.ndarray] | None = None) -> None:
        self.docs = docs
        self.max_length = max_length
        self.masks = masks

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(self.docs[i][: self.max_length].astype(np.int64))
        if self.masks is None:
            return {"input_ids": ids}
        labels = ids.clone()
        labels[torch.from_numpy(self.masks[i][: self.max_length] == 0)] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}


class ListDataset(torch.utils.data.Dataset):
    """Sequences held in a list (a streamed validation split, read once)."""

    def __init__(self, items: list[dict[str, torch.Tensor]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


class PadCollator:
    """Pads every sequence of a batch to max_length (the tutorial recipe); pads are masked out of the loss,
    and so are the tokens a sequence's own labels mask (data.loss_on)."""

    def __init__(self, pad_token_id: int, max_length: int) -> None:
        self.pad_token_id = pad_token_id
        self.max_length = max_length

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        n = len(features)
        input_ids = torch.full((n, self.max_length), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((n, self.max_length), dtype=torch.long)
        for row, f in enumerate(features):
            ids = f["input_ids"][: self.max_length]
            input_ids[row, : len(ids)] = ids
            attention[row, : len(ids)] = 1
        labels = input_ids.masked_fill(attention == 0, IGNORE_INDEX)
        for row, f in enumerate(features):
            if "labels" in f:
                own = f["labels"][: self.max_length]
                labels[row, : len(own)] = own
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


class _Stream(torch.utils.data.IterableDataset):
    """Shared part of the streamed datasets: shuffled rows, rendered and tokenized in batches."""

    def __init__(self, rows: Any, d: DataConfig, tokenizer: Any, seed: int, shuffle: bool) -> None:
        self.rows = rows
        self.d = d
        self.tokenizer = tokenizer
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _documents(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(token ids, loss mask or None) of each streamed document."""
        rows = self.rows
        if self.shuffle:
            rows = rows.shuffle(seed=self.seed, buffer_size=self.d.shuffle_buffer)
            rows.set_epoch(self.epoch)
        if self.d.format != "text":
            from ..conversations.encoding import encode_rows
            from .long_rows import log_longer, sequence_limit

            # A stream is counted as it is read (what a whole-read split says before the first
            # step): at the first batch of rows with one longer than a sequence, and at the end of
            # a pass when more were found after it.
            limit, count, longer, said = sequence_limit(self.d), 0, 0, 0
            for batch in iter_row_batches(rows, batch_docs=256):
                ids, masks = encode_rows(batch, self.d, self.tokenizer, "the stream", count)
                count += len(ids)
                longer += sum(len(x) > limit for x in ids) if limit else 0
                if longer and not said:
                    log_longer(self.d, "streamed", longer, count, limit, so_far=True)
                    said = longer
                yield from zip(ids, masks)
            if longer > said:
                log_longer(self.d, "streamed", longer, count, limit)
            return
        for i, texts in enumerate(_rendered(iter_row_batches(rows, batch_docs=256), self.d, "streamed")):
            docs = encode_texts(texts, self.tokenizer, self.d.add_eos)
            if i == 0:
                check_encoded(len(texts), np.array([len(x) for x in docs], dtype=np.int64), self.d.add_eos, "streamed")
            for doc in docs:
                yield doc, None


class PackedStream(_Stream):
    """Packed blocks from a stream of documents."""

    def __iter__(self):
        size = self.d.block_size
        buffer = np.zeros(0, dtype=np.int32)
        mask_buffer = np.zeros(0, dtype=np.uint8)
        produced = 0
        for doc, mask in self._documents():
            buffer = np.concatenate([buffer, doc])
            mask_buffer = np.concatenate([mask_buffer, np.ones(len(doc), dtype=np.uint8) if mask is None else mask])
            while len(buffer) >= size:
                ids = torch.from_numpy(buffer[:size].astype(np.int64))
                labels = ids.masked_fill(torch.from_numpy(mask_buffer[:size] == 0), IGNORE_INDEX)
                buffer, mask_buffer = buffer[size:], mask_buffer[size:]
                produced += 1
                yield {"input_ids": ids, "labels": labels}
        if not produced:
            # Trainer would otherwise restart the empty stream forever.
            raise UserError(
                f"data: the stream holds less than one block of {size} tokens; lower data.block_size or add data"
            )


class DocumentMaskedStream(_Stream):
    """Blocks of whole documents from a stream (data.document_mask), packed a window of documents at a time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Tokens and block slots of the windows this process has packed so far: the padding is what they leave.
        self.tokens_planned = 0
        self.slots_planned = 0

    def _count(self, plan: DocumentPlan) -> None:
        self.tokens_planned += plan.tokens
        self.slots_planned += plan.blocks * plan.block_size

    def __iter__(self):
        size = self.d.block_size
        produced = 0
        # The blocks of each window come in an order drawn from the seed and the epoch: the same on every read.
        for row in stream_rows(
            self._documents(), size, self.tokenizer.pad_token_id, [self.seed, self.epoch], self._count
        ):
            produced += 1
            yield row
        if not produced:
            raise UserError("data: the stream holds no documents; check data.train_files and data.text_field")


class PaddedStream(_Stream):
    """One truncated sequence per streamed document."""

    def __iter__(self):
        produced = 0
        for doc, mask in self._documents():
            if len(doc):
                produced += 1
                ids = torch.from_numpy(doc[: self.d.max_length].astype(np.int64))
                if mask is None:
                    yield {"input_ids": ids}
                else:
                    yield {
                        "input_ids": ids,
                        "labels": ids.masked_fill(torch.from_numpy(mask[: self.d.max_length] == 0), IGNORE_INDEX),
                    }
        if not produced:
            raise UserError("data: the stream holds no documents; check data.train_files and data.text_field")
