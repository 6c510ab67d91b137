"""`supertune prepare`: read, split, render and tokenize a run config's data once, into a token store.

The documents, the train/validation split and the token ids are exactly those training from the raw
files would use (the same loader, split rule and tokenizer call), so a run from the store sees the
same token stream. The store is written into a temporary directory next to the target and renamed
into place at the end: a crash leaves no half-written store behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..config.schema import RunConfig
from ..data.documents import encode_texts, iter_row_batches, render_texts
from ..data.formats import expand_files
from ..errors import UserError
from .manifest import (
    FORMAT,
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    ShardEntry,
    SourceFile,
    SplitEntry,
    TokenizerEntry,
    sha256_file,
    tokenizer_fingerprint,
    write_manifest,
)

__all__ = ["DEFAULT_SHARD_TOKENS", "prepare_store"]

# Tokens per shard: 2^28 ids are 512 MiB as uint16, 1 GiB as uint32; big enough that a large store
# has few files, small enough to copy, hash and re-send one at a time.
DEFAULT_SHARD_TOKENS = 1 << 28
PROGRESS_SECONDS = 5.0


@dataclass
class _Open:
    handle: BinaryIO
    digest: Any
    name: str
    tokens: int = 0


class _SplitWriter:
    """Appends documents of one split to <split>-NNNNN.bin shards and their ends to <split>.idx."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.shards: list[ShardEntry] = []
        self.current: _Open | None = None
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

    def add(self, docs: list[np.ndarray]) -> None:
        docs = [x for x in docs if len(x)]  # as training does: a document without tokens is no document
        if not docs:
            return
        lengths = np.fromiter((len(x) for x in docs), dtype=np.int64, count=len(docs))
        self._write(self.offsets, (self.tokens + np.cumsum(lengths)).astype("<i8"))
        flat = np.concatenate(docs).astype(self.dtype)
        self.tokens += len(flat)
        self.documents += len(docs)
        while len(flat):
            if self.current is None:
                self.current = self._open(f"{self.split}-{len(self.shards):05d}.bin")
            room = self.shard_tokens - self.current.tokens
            self._write(self.current, flat[:room])
            self.current.tokens += min(room, len(flat))
            flat = flat[room:]
            if self.current.tokens == self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        c = self.current
        assert c is not None
        _finish(c.handle)
        width = self.dtype.itemsize
        self.shards.append(ShardEntry(c.name, c.tokens * width, c.digest.hexdigest(), tokens=c.tokens))
        self.current = None

    def close(self) -> SplitEntry:
        if self.current is not None:
            self._close_shard()
        _finish(self.offsets.handle)
        offsets = FileEntry(self.offsets.name, (self.documents + 1) * 8, self.offsets.digest.hexdigest())
        return SplitEntry(self.documents, self.tokens, offsets, self.shards)


def _finish(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())  # the rename below must not publish data still in the page cache only
    handle.close()


def prepare_store(cfg: RunConfig, tokenizer: Any, out: Path, shard_tokens: int = DEFAULT_SHARD_TOKENS, force: bool = False) -> Manifest:
    """Tokenize cfg's data into a store at `out`; returns its manifest."""
    from ..data.sources import load_raw_splits, training_files, validation_files
    from ..defaults.baseline import unigram_perplexity_from_counts

    d = cfg.data
    if d.dataset_name:
        raise UserError("data.dataset_name: supertune prepare reads local files only so far; give data.train_files")
    _check_target(out, force)
    vocab = len(tokenizer)
    dtype = np.dtype("<u2") if vocab <= 1 << 16 else np.dtype("<u4")
    # Hashing the sources reads them once more (about 1-2 GB/s); it lets a store name exactly what it came from.
    sources = {"train": _sources(training_files(d)), "validation": _sources(validation_files(d))}
    size = sum(f.size for fs in sources.values() for f in fs)
    print(f"supertune: prepare: reading {sum(map(len, sources.values()))} files ({size / 1e6:,.1f} MB)", file=sys.stderr, flush=True)
    raw = load_raw_splits(d, cfg.training.seed)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        counts: dict[str, np.ndarray] = {}
        splits = {}
        for name, rows in (("train", raw.train), ("validation", raw.validation)):
            writer = _SplitWriter(tmp, name, dtype, shard_tokens)
            counts[name] = _tokenize(rows, cfg, tokenizer, writer, name, vocab)
            splits[name] = writer.close()
        if not splits["train"].tokens:
            raise UserError(f"data: no training text found in column {d.text_field!r}; check data.text_field and the files")
        if not splits["validation"].tokens:
            raise UserError("data: the validation split is empty; give data.validation_files or raise data.validation_split_percentage")
        manifest = Manifest(
            format=FORMAT,
            version=FORMAT_VERSION,
            tokenizer=TokenizerEntry(tokenizer_fingerprint(tokenizer), vocab, int(tokenizer.eos_token_id), _name(tokenizer)),
            template=d.template,
            text_field=d.text_field,
            add_eos=d.add_eos,
            split_rule=_split_rule(cfg),
            sources=sources,
            dtype=dtype.name,
            splits=splits,
            unigram_perplexity=unigram_perplexity_from_counts(counts["train"], counts["validation"]),
        )
        write_manifest(tmp, manifest)
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _tokenize(rows: Any, cfg: RunConfig, tokenizer: Any, writer: _SplitWriter, name: str, vocab: int) -> np.ndarray:
    """Render and tokenize a split in batches (the tokenizer's Rust threads use every core); returns its unigram counts."""
    counts = np.zeros(vocab, dtype=np.int64)
    total = len(rows) if hasattr(rows, "__len__") else None
    started = last = time.monotonic()
    seen = 0
    for batch in iter_row_batches(rows):
        docs = encode_texts(render_texts(batch, cfg.data), tokenizer, cfg.data.add_eos)
        writer.add(docs)
        if docs:
            counts += np.bincount(np.concatenate(docs), minlength=vocab)
        seen += len(next(iter(batch.values()))) if batch else 0
        now = time.monotonic()
        if now - last >= PROGRESS_SECONDS:
            last = now
            _progress(name, seen, total, writer.tokens, now - started)
    _progress(name, seen, total, writer.tokens, time.monotonic() - started)
    return counts


def _progress(name: str, rows: int, total: int | None, tokens: int, seconds: float) -> None:
    of = f"/{total:,}" if total is not None else ""
    rate = tokens / seconds if seconds > 0 else 0.0
    print(f"supertune: prepare {name}: {rows:,}{of} rows, {tokens:,} tokens ({rate:,.0f} tokens/s)", file=sys.stderr, flush=True)


def _split_rule(cfg: RunConfig) -> dict[str, Any]:
    d = cfg.data
    rule: dict[str, Any] = {"max_train_samples": d.max_train_samples, "max_eval_samples": d.max_eval_samples}
    if d.validation_files or not d.train_files:  # no train files: the embedded corpus, which has its own validation file
        rule["validation"] = "files"
    else:
        rule.update(validation="percentage", percentage=d.validation_split_percentage, seed=cfg.training.seed)
    return rule


def _sources(patterns: list[str]) -> list[SourceFile]:
    files = expand_files(patterns)
    return [SourceFile(os.path.basename(f), os.path.getsize(f), sha256_file(Path(f))) for f in files]


def _name(tokenizer: Any) -> str:
    return os.path.basename(str(getattr(tokenizer, "name_or_path", "")).rstrip("/")) or "tokenizer"


def _check_target(out: Path, force: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory; choose another path")
    if any(out.iterdir()) and not (force and (out / "manifest.json").is_file()):
        hint = "pass --force to replace the store" if (out / "manifest.json").is_file() else "choose an empty or new directory"
        raise UserError(f"--out: {out} is not empty; {hint}")


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished store into place; an old store is moved aside first and removed last."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
