"""`supertune prepare`: read, split, render and tokenize a run config's data once, into a token store.

The documents, the train/validation split and the token ids are exactly those training from the raw
files would use (the same loader, split rule and tokenizer call), so a run from the store sees the
same token stream. The store is written into a temporary directory next to the target and renamed
into place at the end: a crash leaves no half-written store behind.
"""

from __future__ import annotations

import gc
import hashlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..config.schema import RunConfig
from ..documents.encode_threads import encode_in_threads
from ..documents.encoding import iter_row_batches, render_texts
from ..documents.sample_checks import check_rows
from ..errors import UserError
from ..file_table import FileEntry
from ..modeling.tokenizer import token_id_limit
from ..output_dirs import Staging, check_output_dir
from .manifest import (
    FORMAT,
    FORMAT_VERSION,
    Manifest,
    ShardEntry,
    SourceFile,
    SplitEntry,
    TokenizerEntry,
    stored_rows,
    tokenizer_fingerprint,
    write_manifest,
)
from .progress import Progress

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "SplitWriter",
    "StorePlan",
    "check_target",
    "finish_file",
    "id_dtype",
    "prepare_store",
    "tokenize_rows",
    "write_store",
]

# Tokens per shard: 2^28 ids are 512 MiB as uint16, 1 GiB as uint32; big enough that a large store
# has few files, small enough to copy, hash and re-send one at a time.
DEFAULT_SHARD_TOKENS = 1 << 28


@dataclass
class _Open:
    handle: BinaryIO
    digest: Any
    name: str
    tokens: int = 0


class SplitWriter:
    """Appends documents of one split to <split>-NNNNN.bin shards and their ends to <split>.idx."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.shards: list[ShardEntry] = []
        self.masks: list[ShardEntry] = []
        self.current: _Open | None = None
        self.current_mask: _Open | None = None
        self.tokens = 0
        self.documents = 0
        self.offsets = self._open(f"{split}.idx")
        self._write(self.offsets, np.zeros(1, dtype="<i8"))

    def _open(self, name: str) -> _Open:
        return _Open(open(self.directory / name, "wb"), hashlib.sha256(), name)

    @staticmethod
    def _write(target: _Open, array: np.ndarray) -> None:
        data = array.tobytes()
        target.handle.write(data)
        target.digest.update(data)

    def add_flat(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Documents given as their concatenated ids and their (positive) lengths; `mask`: their loss
        mask, one byte per token, written to <split>-NNNNN.mask shards beside the ids (the same tokens each)."""
        if not len(lengths):
            return
        self._write(self.offsets, (self.tokens + np.cumsum(lengths)).astype("<i8"))
        flat = flat.astype(self.dtype, copy=False)
        if mask is not None:
            mask = mask.astype(np.uint8, copy=False)
        self.tokens += len(flat)
        self.documents += len(lengths)
        while len(flat):
            if self.current is None:
                self.current = self._open(f"{self.split}-{len(self.shards):05d}.bin")
                if mask is not None:
                    self.current_mask = self._open(f"{self.split}-{len(self.shards):05d}.mask")
            room = self.shard_tokens - self.current.tokens
            self._write(self.current, flat[:room])
            if mask is not None and self.current_mask is not None:
                self._write(self.current_mask, mask[:room])
                mask = mask[room:]
            self.current.tokens += min(room, len(flat))
            flat = flat[room:]
            if self.current.tokens == self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        c = self.current
        assert c is not None
        finish_file(c.handle)
        width = self.dtype.itemsize
        self.shards.append(ShardEntry(c.name, c.tokens * width, c.digest.hexdigest(), tokens=c.tokens))
        self.current = None
        m = self.current_mask
        if m is not None:
            finish_file(m.handle)
            self.masks.append(ShardEntry(m.name, c.tokens, m.digest.hexdigest(), tokens=c.tokens))
            self.current_mask = None

    def close(self) -> SplitEntry:
        if self.current is not None:
            self._close_shard()
        finish_file(self.offsets.handle)
        offsets = FileEntry(self.offsets.name, (self.documents + 1) * 8, self.offsets.digest.hexdigest())
        return SplitEntry(self.documents, self.tokens, offsets, self.shards, self.masks)


def finish_file(handle: BinaryIO) -> None:
    """Flush, fsync and close: a rename that publishes the file must not come before its data."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def prepare_store(
    cfg: RunConfig,
    tokenizer: Any,
    out: Path,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    force: bool = False,
    bundle: bool = False,
) -> Manifest:
    """Tokenize cfg's data into a store at `out` in this process; returns its manifest."""
    from ..documents.sources import load_raw_splits

    check_target(out, force)
    plan = StorePlan.of(cfg, tokenizer, bundle)
    raw = load_raw_splits(cfg.data, cfg.training.seed)

    def fill(tmp: Path) -> Manifest:
        counts: dict[str, np.ndarray] = {}
        splits = {}
        for name, rows in (("train", raw.train), ("validation", raw.validation)):
            writer = SplitWriter(tmp, name, plan.dtype, shard_tokens)
            counts[name] = tokenize_rows(rows, cfg, tokenizer, writer.add_flat, name)
            splits[name] = writer.close()
        return plan.manifest(tmp, cfg, tokenizer, splits, counts)

    return write_store(out, fill)


def id_dtype(tokenizer: Any) -> np.dtype:
    """Little-endian uint16 when every id fits (vocabularies up to 65,536), else uint32."""
    return np.dtype("<u2") if token_id_limit(tokenizer) <= 1 << 16 else np.dtype("<u4")


@dataclass
class StorePlan:
    """What a store records beside its token ids, known before tokenizing: id width, sources, bundle."""

    dtype: np.dtype
    tokenizer: str
    """The tokenizer's fingerprint (a JSON round trip of it: computed once, here)."""
    hashing: Future  # of dict[str, list[SourceFile]]: the sources, hashed while the documents are tokenized
    bundle: bool

    @classmethod
    def of(cls, cfg: RunConfig, tokenizer: Any, bundle: bool) -> StorePlan:
        from .sources import hash_sources, source_paths

        dtype = id_dtype(tokenizer)
        paths = source_paths(cfg.data)
        size = sum(os.path.getsize(f) for fs in paths.values() for f in fs)
        count = sum(map(len, paths.values()))
        print(f"supertune: prepare: reading {count} files ({size / 1e6:,.1f} MB)", file=sys.stderr, flush=True)
        # Hashing reads the sources once more (about 1-2 GB/s per core, without the GIL) so that a
        # store names exactly what it came from; beside the tokenizing, which takes far longer, it
        # costs no wall time. A daemon thread: a prepare that fails or is interrupted exits at once.
        hashing: Future = Future()

        def run() -> None:
            try:
                hashing.set_result(hash_sources(paths))
            except BaseException as exc:  # handed to whoever asks for the result
                hashing.set_exception(exc)

        threading.Thread(target=run, name="hash-sources", daemon=True).start()
        return cls(dtype, tokenizer_fingerprint(tokenizer), hashing, bundle)

    @property
    def sources(self) -> dict[str, list[SourceFile]]:
        return self.hashing.result()

    def manifest(
        self, tmp: Path, cfg: RunConfig, tokenizer: Any, splits: dict[str, SplitEntry], counts: dict[str, np.ndarray]
    ) -> Manifest:
        """Check the splits, write the bundle (when asked) and the manifest into `tmp`."""
        from ..embedded.baseline import unigram_perplexity_from_counts
        from ..modeling.bundle import write_bundle

        d = cfg.data
        if not splits["train"].tokens:
            raise UserError(
                f"data: no training text found in column {d.text_field!r}; check data.text_field and the files"
            )
        if not splits["validation"].tokens:
            raise UserError(
                "data: the validation split is empty; give data.validation_files or raise data.validation_split_percentage"
            )
        manifest = Manifest(
            format=FORMAT,
            version=FORMAT_VERSION,
            tokenizer=TokenizerEntry(self.tokenizer, len(tokenizer), int(tokenizer.eos_token_id), _name(tokenizer)),
            template=d.template,
            text_field=d.text_field,
            add_eos=d.add_eos,
            split_rule=_split_rule(cfg, bool(self.sources.get("validation"))),
            sources=self.sources,
            dtype=self.dtype.name,
            splits=splits,
            unigram_perplexity=unigram_perplexity_from_counts(counts["train"], counts["validation"]),
            dataset={"name": _dataset_name(d.dataset_name), "config": d.dataset_config} if d.dataset_name else None,
            bundle=write_bundle(tmp, cfg, tokenizer) if self.bundle else None,
            rows=stored_rows(d, tokenizer),
        )
        write_manifest(tmp, manifest)
        return manifest


def write_store(out: Path, fill: Callable[[Path], Manifest]) -> Manifest:
    """Let `fill` write a store into a staging directory next to `out`, then rename it into place
    (a store already there, checked by check_target, is replaced only then)."""
    with Staging(out, "--out", replace=True) as staging:
        manifest = fill(staging.path)
        staging.publish()
    return manifest


def tokenize_rows(
    rows: Any, cfg: RunConfig, tokenizer: Any, sink: Callable[..., None], name: str, first_row: int = 0
) -> np.ndarray:
    """Render and tokenize rows in batches on every core (documents/encode_threads.py), giving each batch's
    documents to `sink` in order as (concatenated ids, lengths), and their loss masks as a third argument
    for data.format chat and prompt_completion; returns the unigram counts of the split. `first_row`:
    the number of the first row in its split (a part of an array prepare), for the error a bad row raises."""
    # The libraries loaded so far (transformers, torch, datasets: about 250,000 objects) stay out of
    # every later full garbage collection; the batches' lists trigger one, which cost 0.13 s of a
    # 2.5 s prepare. Frozen objects are still freed by reference counting; only garbage cycles
    # among them would outlive this, and a prepare process ends after writing.
    gc.freeze()
    vocab = token_id_limit(tokenizer)  # a vocabulary with gaps has ids up to this, beyond its length
    counts = np.zeros(vocab, dtype=np.int64)
    total = len(rows) if hasattr(rows, "__len__") else None
    progress = Progress(name, total)
    if cfg.data.format != "text":
        return _masked_rows(rows, cfg, tokenizer, sink, name, counts, progress, first_row)
    batches = (
        (_row_count(batch), render_texts(batch, cfg.data))
        for batch in _first_checked(iter_row_batches(rows), cfg, name)
    )
    for row_count, flat, lengths in encode_in_threads(batches, tokenizer, cfg.data.add_eos):
        sink(flat, lengths)
        counts += np.bincount(flat, minlength=vocab)
        progress.update(row_count, len(flat))
    progress.close()
    return counts


def _masked_rows(
    rows: Any,
    cfg: RunConfig,
    tokenizer: Any,
    sink: Callable[..., None],
    name: str,
    counts: np.ndarray,
    progress: Any,
    first_row: int,
) -> np.ndarray:
    """Conversations or prompt/completion rows: ids and loss masks as training encodes them
    (supertune.conversations.encoding), every row checked; the unigram counts are of the trained tokens,
    the baseline of the loss a run from the store reports."""
    from ..conversations.encoding import encode_rows

    first = first_row
    for batch in iter_row_batches(rows):
        ids, masks = encode_rows(batch, cfg.data, tokenizer, f"the {name} split", first)
        first += len(ids)
        if ids:
            flat, mask = np.concatenate(ids), np.concatenate(masks)
            sink(flat, np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), mask)
            counts += np.bincount(flat[mask == 1], minlength=len(counts))
            progress.update(len(ids), len(flat))
    progress.close()
    return counts


def _first_checked(batches: Any, cfg: RunConfig, name: str) -> Any:
    """The batches of rows, the first one checked for rows that would tokenize into garbage (data.sample_checks)."""
    for i, batch in enumerate(batches):
        if i == 0:
            check_rows(batch, cfg.data, name)
        yield batch


def _row_count(batch: dict[str, list[Any]]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def _split_rule(cfg: RunConfig, validation_source: bool) -> dict[str, Any]:
    """validation_source: the validation documents have sources of their own (validation files, the
    embedded corpus's validation file, a hub dataset's validation split) instead of a held-out share."""
    d = cfg.data
    rule: dict[str, Any] = {"max_train_samples": d.max_train_samples, "max_eval_samples": d.max_eval_samples}
    if validation_source:
        rule["validation"] = "files"
        if d.dataset_name:
            rule["validation_split"] = d.validation_split  # auto: validation, else test (the sources name the files)
    else:
        rule.update(validation="percentage", percentage=d.validation_split_percentage, seed=cfg.training.seed)
    if d.sample == "shuffled":  # which documents max_*_samples kept (the first N otherwise)
        rule.update(sample="shuffled", seed=cfg.training.seed)
    return rule


def _dataset_name(name: str) -> str:
    """A hub id as is; a local dataset directory by its base name (no absolute paths in a manifest)."""
    return os.path.basename(name.rstrip("/")) if os.path.isdir(os.path.expanduser(name)) else name


def _name(tokenizer: Any) -> str:
    return os.path.basename(str(getattr(tokenizer, "name_or_path", "")).rstrip("/")) or "tokenizer"


def check_target(out: Path, force: bool) -> Path:
    """`out` as an absolute path when a store may be written there: new, empty, or (with --force) a store."""
    out = check_output_dir(out, "--out", "token store (manifest.json)", own=_holds_store)
    if not force and _holds_store(out):
        raise UserError(f"--out: {out} holds a token store; pass --force to replace it, or choose another path")
    return out


def _holds_store(path: Path) -> bool:
    """Whether `path` holds a token store: its manifest.json names supertune's store format (a manifest of anything else does not)."""
    import json

    try:
        return json.loads((path / "manifest.json").read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False
