"""The data section of a run config, turned into the train and eval datasets the Trainer consumes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..config.schema import DataConfig
from ..documents.sources import RawSplits, load_raw_splits, load_validation_rows
from ..errors import UserError
from ..modeling.tokenizer import token_id_limit
from .batches import (
    DocumentMaskedStream,
    ListDataset,
    PackedBlocks,
    PackedStream,
    PadCollator,
    PaddedDocuments,
    PaddedStream,
    TokenizedSplit,
    tokenize_split,
)
from .document_bins import DocumentBins
from .long_rows import log_longer, rows_name, sequence_limit

__all__ = ["TrainingData", "build_training_data", "build_eval_dataset"]

log = logging.getLogger("supertune")


@dataclass
class TrainingData:
    """Datasets, collator and the numbers a run reports about its data."""

    train: Any
    validation: Any
    collator: Any | None
    max_length: int | None
    train_tokens_available: int | None
    """Tokens in the training split (None when streaming)."""
    unigram_perplexity: float | None
    """Perplexity of a unigram model of the training tokens on the validation tokens (None when streaming)."""
    loss_tokens_available: int | None = None
    """Tokens of the training split the loss is computed on (data.loss_on); None when every token is, or streaming."""
    padding_share: float | None = None
    """Pad slots / all slots of the training blocks with data.document_mask (of the validation blocks when
    streaming, whose training blocks are known only as they are read); None otherwise."""


def build_training_data(d: DataConfig, tokenizer: Any, seed: int, context_length: int) -> TrainingData:
    """Load, render, tokenize and batch the configured data (or read it from data.store)."""
    _check_context(d, context_length)
    if d.store:
        return _stored(d, tokenizer, context_length)
    raw = load_raw_splits(d, seed)
    if d.streaming:
        return _streamed(raw, d, tokenizer, seed)
    train = tokenize_split(raw.train, d, tokenizer, "training")
    validation = tokenize_split(raw.validation, d, tokenizer, "validation")
    if not train.docs:
        raise UserError(f"data: no training text found in column {d.text_field!r}; check data.text_field and the files")
    if not validation.docs:
        raise UserError(
            "data: the validation split is empty; give data.validation_files or raise data.validation_split_percentage"
        )
    _log_masked(train, d, "training", context_length)
    loss_tokens = None if train.masks is None else train.loss_tokens
    baseline = _unigram(train, validation, token_id_limit(tokenizer))
    if d.packing and d.document_mask:
        bins = _document_bins(
            train.concatenated(), train.offsets(), d, tokenizer, "training", train.concatenated_mask()
        )
        return TrainingData(
            train=bins,
            validation=_document_bins(
                validation.concatenated(),
                validation.offsets(),
                d,
                tokenizer,
                "validation",
                validation.concatenated_mask(),
            ),
            collator=None,
            max_length=None,
            train_tokens_available=train.num_tokens,
            unigram_perplexity=baseline,
            padding_share=bins.plan.padding_share,
            loss_tokens_available=loss_tokens,
        )
    if d.packing:
        return TrainingData(
            train=_blocks(train.concatenated(), d, "training", train.concatenated_mask()),
            validation=_blocks(validation.concatenated(), d, "validation", validation.concatenated_mask()),
            collator=None,
            max_length=None,
            train_tokens_available=train.num_tokens,
            unigram_perplexity=baseline,
            loss_tokens_available=loss_tokens,
        )
    max_length = d.max_length or min(max(len(x) for x in train.docs), context_length)
    return TrainingData(
        train=PaddedDocuments(train.docs, max_length, train.masks),
        validation=PaddedDocuments(validation.docs, max_length, validation.masks),
        collator=PadCollator(tokenizer.pad_token_id, max_length),
        max_length=max_length,
        train_tokens_available=train.num_tokens,
        unigram_perplexity=baseline,
        loss_tokens_available=loss_tokens,
    )


def build_eval_dataset(d: DataConfig, tokenizer: Any, context_length: int, seed: int) -> tuple[Any, Any]:
    """The run's validation documents (`load_validation_rows`: held out by `seed` where training held
    them out), batched as in training: (dataset, collator)."""
    _check_context(d, context_length)
    if d.store:
        from ..store.reader import open_store_for_run

        store = open_store_for_run(d, tokenizer)
        v = store.validation
        if d.packing and d.document_mask:
            return _document_bins(v.tokens, v.offsets, d, tokenizer, "evaluation", v.loss_mask), None
        if d.packing:
            return _blocks(v.tokens, d, "evaluation", v.loss_mask), None
        max_length = d.max_length or min(v.longest(), context_length)
        return PaddedDocuments(v, max_length, v.masks()), PadCollator(tokenizer.pad_token_id, max_length)
    split = tokenize_split(load_validation_rows(d, seed), d, tokenizer, "evaluation")
    if not split.docs:
        raise UserError(f"data: no text to evaluate in column {d.text_field!r}; check data.text_field and the files")
    mask = split.concatenated_mask()
    if d.packing and d.document_mask:
        return _document_bins(split.concatenated(), split.offsets(), d, tokenizer, "evaluation", mask), None
    if d.packing:
        return _blocks(split.concatenated(), d, "evaluation", mask), None
    max_length = d.max_length or min(max(len(x) for x in split.docs), context_length)
    return PaddedDocuments(split.docs, max_length, split.masks), PadCollator(tokenizer.pad_token_id, max_length)


def _check_context(d: DataConfig, context_length: int) -> None:
    """Sequences no longer than the model's positions: a longer one is an index error at the first
    batch on the CPU (a device-side assert on a GPU) for learned positions, and untrained positions
    for rotary ones."""
    key, length = ("data.block_size", d.block_size) if d.packing else ("data.max_length", d.max_length)
    if length is not None and length > context_length:
        raise UserError(
            f"{key}: {length} tokens per sequence, but the model has {context_length} positions (max_position_embeddings); "
            f"use at most {context_length}, or a model built with more (model.config_overrides=max_position_embeddings=N with fresh weights)"
        )


def _blocks(tokens: Any, d: DataConfig, name: str, loss_mask: Any = None) -> PackedBlocks:
    blocks = PackedBlocks(tokens, d.block_size, loss_mask)
    if len(blocks) == 0:
        raise UserError(
            f"data.block_size: the {name} split has {len(tokens)} tokens, fewer than one block of {d.block_size}; "
            "lower data.block_size or add data"
        )
    return blocks


def _document_bins(
    tokens: Any, offsets: Any, d: DataConfig, tokenizer: Any, name: str, loss_mask: Any = None
) -> DocumentBins:
    """Blocks of whole documents (data.document_mask), with the padding they leave in the run's log."""
    bins = DocumentBins(tokens, offsets, d.block_size, tokenizer.pad_token_id, loss_mask)
    plan = bins.plan
    log.info(
        "document mask: %s split, %d documents (%d longer than %d tokens, split into pieces) in %d blocks; padding %.1f %%",
        name,
        plan.documents,
        plan.split_documents,
        plan.block_size,
        plan.blocks,
        100 * plan.padding_share,
    )
    return bins


def _log_masked(split: TokenizedSplit, d: DataConfig, name: str, context_length: int) -> None:
    """The loss tokens of conversations or prompt/completion rows, and what happens to the rows longer
    than a sequence: they are kept and cut as any document is (never refused), and the log says how many."""
    if split.masks is None:
        return
    log.info(
        "%s: %s split, %d %s, %d tokens, %d of them trained on (data.loss_on=%s)",
        d.format,
        name,
        len(split.docs),
        rows_name(d),
        split.num_tokens,
        split.loss_tokens,
        d.loss_target,
    )
    limit = sequence_limit(d) or min(max(len(x) for x in split.docs), context_length)
    log_longer(d, name, sum(len(x) > limit for x in split.docs), len(split.docs), limit)


def _stored(d: DataConfig, tokenizer: Any, context_length: int) -> TrainingData:
    """Packed blocks, or padded documents, over the memory-mapped shards of a token store (checked before use).

    Either way the dataset is map-style over the store: the Trainer's sampler shuffles it by
    training.seed and a resumed run skips to its position, which a stream cannot do exactly;
    data.streaming changes nothing here, the memory map already reads lazily.
    """
    import numpy as np

    from ..store.reader import open_store_for_run

    store = open_store_for_run(d, tokenizer)
    padding = None
    t, v = store.train, store.validation
    if d.packing and d.document_mask:
        train = _document_bins(t.tokens, t.offsets, d, tokenizer, "training", t.loss_mask)
        validation = _document_bins(v.tokens, v.offsets, d, tokenizer, "validation", v.loss_mask)
        collator, max_length, padding = None, None, train.plan.padding_share
    elif d.packing:
        train, validation = (
            _blocks(t.tokens, d, "training", t.loss_mask),
            _blocks(v.tokens, d, "validation", v.loss_mask),
        )
        collator, max_length = None, None
    else:
        max_length = d.max_length or min(t.longest(), context_length)
        train, validation = PaddedDocuments(t, max_length, t.masks()), PaddedDocuments(v, max_length, v.masks())
        collator = PadCollator(tokenizer.pad_token_id, max_length)
    if t.loss_mask is not None:  # conversations or prompt/completion rows: say how many are cut, as files do
        limit = d.block_size if d.packing else max_length
        lengths = np.diff(t.offsets)
        log_longer(d, "training", int((lengths > limit).sum()), len(lengths), limit)
    return TrainingData(
        train=train,
        validation=validation,
        collator=collator,
        max_length=max_length,
        train_tokens_available=len(store.train.tokens),
        unigram_perplexity=store.manifest.unigram_perplexity,
        padding_share=padding,
    )


def _unigram(train: TokenizedSplit, validation: TokenizedSplit, vocab_size: int) -> float:
    from ..embedded import unigram_perplexity

    # Over the loss tokens alone when there is a mask: the baseline of the same tokens the eval loss is over.
    return unigram_perplexity(_loss_tokens(train), _loss_tokens(validation), vocab_size)


def _loss_tokens(split: TokenizedSplit) -> list[Any]:
    if split.masks is None:
        return split.docs
    return [doc[mask == 1] for doc, mask in zip(split.docs, split.masks)]


def _streamed(raw: RawSplits, d: DataConfig, tokenizer: Any, seed: int) -> TrainingData:
    stream = (DocumentMaskedStream if d.document_mask else PackedStream) if d.packing else PaddedStream
    train = stream(raw.train, d, tokenizer, seed, shuffle=True)
    # Validation is finite (its files, or the documents held out of the stream) and is read once
    # into memory, so that evaluation can index it and split it exactly across processes.
    held_out = stream(raw.validation, d, tokenizer, seed, shuffle=False)
    validation = ListDataset(list(held_out))
    collator = None if d.packing else PadCollator(tokenizer.pad_token_id, d.max_length)
    padding = None
    if isinstance(held_out, DocumentMaskedStream) and held_out.slots_planned:
        # The stream's own blocks are known only as they are read; the validation documents come
        # from the same source (or are held out of the same stream) and give the estimate.
        padding = 1.0 - held_out.tokens_planned / held_out.slots_planned
        log.info(
            "document mask: streaming; padding %.1f %% in the %d validation blocks", 100 * padding, len(validation)
        )
    return TrainingData(train, validation, collator, d.max_length, None, None, padding_share=padding)
