"""A store made by several processes: N parts tokenized independently (a SLURM array), then merged.

Part i holds rows [i*n/N, (i+1)*n/N) of each split, in the order a single `prepare` reads them,
as raw token ids and document lengths, and for conversations and prompt/completion rows
(data.format) their loss masks, one byte per token. The merge streams the parts, in order, through the same
shard writer a single `prepare` uses, so the store it publishes is byte-identical to the one a
single process writes from the same inputs (manifest included): copying the ids once more costs a
sequential read and write of the store, seconds per GB, against minutes to hours of tokenizing.

The work directory, `<out>.prepare/` next to the store, holds the resolved config, the plan (what
the parts were cut from), the job scripts, the job logs and `parts/part-NNNNN/`. A part directory
appears by an atomic rename once complete, so a finished part is never redone and an interrupted
one is redone from its start. The parts are removed after a successful merge; the scripts and logs
stay.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import RunConfig
from ..errors import UserError
from ..output_dirs import Staging, check_output_dir
from .manifest import Manifest, tokenizer_fingerprint
from .writer import SplitWriter, StorePlan, check_target, finish_file, id_dtype, tokenize_rows, write_store

__all__ = [
    "ArrayPlan",
    "PLAN",
    "work_dir",
    "check_work_dir",
    "plan_array",
    "finished_parts",
    "run_part",
    "merge_parts",
    "CONFIG",
    "LOGS",
]

PLAN = "plan.json"
CONFIG = "config.yaml"
LOGS = "logs"
PARTS = "parts"
DONE = "done.json"
SPLITS = ("train", "validation")
# Token ids copied per write in the merge: 2^26 ids are 128-256 MiB of memory.
MERGE_CHUNK_TOKENS = 1 << 26


@dataclass(frozen=True)
class ArrayPlan:
    """What the parts of a store are cut from; a re-run with another plan must not reuse them."""

    out: str
    parts: int
    shard_tokens: int
    bundle: bool
    force: bool
    config_sha256: str
    """sha256 of the resolved run config the parts are made with (config.yaml in the work directory)."""
    sources: list[list[Any]]
    """[path, size, mtime_ns] of every source file (or the hub dataset's name): a changed file makes finished parts stale."""

    def same_work(self, other: ArrayPlan) -> bool:
        return (self.out, self.parts, self.config_sha256, self.sources) == (
            other.out,
            other.parts,
            other.config_sha256,
            other.sources,
        )


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".prepare")


def plan_array(
    cfg: RunConfig, config_text: str, out: Path, parts: int, shard_tokens: int, bundle: bool, force: bool
) -> Path:
    """Create (or take up again) the work directory of an array prepare; returns it. A new one (no
    plan.json yet) is made in a staging directory beside it and renamed into place.

    A work directory of the same plan is reused with its finished parts; one of another plan is
    refused unless `force`, which discards its parts.
    """
    check_target(out, force)
    work = check_work_dir(out)
    plan = ArrayPlan(str(out), parts, shard_tokens, bundle, force, _sha256(config_text), _source_stats(cfg))
    old = _read_plan(work) if (work / PLAN).is_file() else None
    if old is not None and not old.same_work(plan):
        if not force:
            raise UserError(
                f"--out: {work} holds the parts of another prepare of {out} (other config, --shards or changed sources); "
                "pass --force to discard them, or run with the same settings"
            )
        shutil.rmtree(work / PARTS, ignore_errors=True)

    def fill(directory: Path) -> None:
        (directory / LOGS).mkdir(parents=True, exist_ok=True)
        (directory / PARTS).mkdir(exist_ok=True)
        (directory / CONFIG).write_text(config_text, encoding="utf-8")
        (directory / PLAN).write_text(json.dumps(asdict(plan), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    if old is not None:
        fill(work)
        return work
    with Staging(work, "--out") as staging:  # a new work directory appears whole, by one rename
        fill(staging.path)
        staging.publish()
    return work


def check_work_dir(out: Path) -> Path:
    """The work directory of a store at `out`, when supertune may write there: new, empty, or an
    array prepare's own (its plan.json); a directory of the user's named like it is refused."""
    return check_output_dir(
        work_dir(out), "--out", "prepare work directory (plan.json)", own=lambda path: (path / PLAN).is_file()
    )


def finished_parts(work: Path, parts: int) -> list[int]:
    return [i for i in range(parts) if (_part_dir(work, i) / DONE).is_file()]


def run_part(work: Path, index: int) -> None:
    """Tokenize part `index` of the plan in `work`, unless it is finished already."""
    from ..documents.sources import load_raw_splits
    from ..modeling.tokenizer import load_tokenizer

    plan = _read_plan(work)
    if not 0 <= index < plan.parts:
        raise UserError(f"--part: {index} is not a part of this plan (0 to {plan.parts - 1})")
    final = _part_dir(work, index)
    if (final / DONE).is_file():
        print(
            f"supertune: prepare: part {index} of {plan.parts} is finished already; skipped",
            file=sys.stderr,
            flush=True,
        )
        return
    cfg = _load_config(work)
    tokenizer = load_tokenizer(cfg)
    dtype = id_dtype(tokenizer)
    raw = load_raw_splits(cfg.data, cfg.training.seed)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        summary: dict[str, Any] = {"tokenizer": tokenizer_fingerprint(tokenizer)}
        for name, rows in (("train", raw.train), ("validation", raw.validation)):
            n = len(rows)
            first = index * n // plan.parts
            piece = rows.select(range(first, (index + 1) * n // plan.parts))
            masked = cfg.data.format != "text"
            with (
                open(tmp / f"{name}.bin", "wb") as ids,
                open(tmp / f"{name}.len", "wb") as lengths,
                open(tmp / f"{name}.mask", "wb") if masked else nullcontext() as masks,
            ):

                def sink(
                    flat: np.ndarray,
                    doc_lengths: np.ndarray,
                    mask: np.ndarray | None = None,
                    ids=ids,
                    lengths=lengths,
                    masks=masks,
                ) -> None:
                    ids.write(flat.astype(dtype).tobytes())
                    lengths.write(doc_lengths.astype("<i8").tobytes())
                    if masks is not None and mask is not None:
                        masks.write(mask.astype(np.uint8).tobytes())

                counts = tokenize_rows(piece, cfg, tokenizer, sink, f"{name} part {index}/{plan.parts}", first)
                for handle in (ids, lengths, masks):
                    if handle is not None:
                        finish_file(handle)
            np.save(tmp / f"{name}.counts.npy", counts)
            summary[name] = {"rows": len(piece)}
        (tmp / DONE).write_text(json.dumps(summary, sort_keys=True) + "\n", encoding="utf-8")
        os.rename(tmp, final)  # the part exists only once complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"supertune: prepare: part {index} of {plan.parts} finished", file=sys.stderr, flush=True)


def merge_parts(work: Path) -> tuple[Path, Manifest]:
    """Write the store from the finished parts, exactly as a single prepare would; remove the parts.
    Returns the store directory and its manifest."""
    from ..modeling.tokenizer import load_tokenizer

    plan = _read_plan(work)
    missing = [i for i in range(plan.parts) if i not in finished_parts(work, plan.parts)]
    if missing:
        listed = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise UserError(
            f"--merge: part(s) {listed} of {plan.parts} are not finished (see {work / LOGS}); "
            "run the same supertune prepare --submit again: finished parts are kept"
        )
    out = Path(plan.out)
    check_target(out, plan.force)
    cfg = _load_config(work)
    tokenizer = load_tokenizer(cfg)
    store_plan = StorePlan.of(cfg, tokenizer, plan.bundle)
    for i in range(plan.parts):
        if json.loads((_part_dir(work, i) / DONE).read_text())["tokenizer"] != store_plan.tokenizer:
            raise UserError(
                f"--merge: part {i} was tokenized with another tokenizer than the merge loads; run prepare --submit --force"
            )

    def fill(tmp: Path) -> Manifest:
        splits, counts = {}, {}
        for name in SPLITS:
            writer = SplitWriter(tmp, name, store_plan.dtype, plan.shard_tokens)
            counts[name] = np.zeros(len(tokenizer), dtype=np.int64)
            for i in range(plan.parts):
                part = _part_dir(work, i)
                _copy_part(part, name, store_plan.dtype, writer, cfg.data.format != "text")
                counts[name] += np.load(part / f"{name}.counts.npy")
            splits[name] = writer.close()
        return store_plan.manifest(tmp, cfg, tokenizer, splits, counts)

    manifest = write_store(out, fill)
    shutil.rmtree(work / PARTS, ignore_errors=True)
    return out, manifest


def _copy_part(part: Path, name: str, dtype: np.dtype, writer: SplitWriter, masked: bool) -> None:
    """Feed a part's documents (and, `masked`, their loss masks) to the writer in chunks of whole
    documents (memory stays at one chunk)."""
    lengths = np.fromfile(part / f"{name}.len", dtype="<i8")
    if not len(lengths):
        return
    ids = np.memmap(part / f"{name}.bin", dtype=dtype, mode="r")
    masks = _part_masks(part, name) if masked else None
    if int(lengths.sum()) != len(ids) or (masks is not None and len(masks) != len(ids)):
        raise UserError(
            f"--merge: {part / (name + '.bin')} does not hold the tokens its lengths say (damaged); delete {part} and submit again"
        )
    ends = np.cumsum(lengths)
    first, start = 0, 0
    while first < len(lengths):
        # Documents up to the one that crosses the next chunk boundary (at least one document).
        last = max(first + 1, int(np.searchsorted(ends, start + MERGE_CHUNK_TOKENS, side="right")))
        stop = int(ends[last - 1])
        mask = None if masks is None else np.asarray(masks[start:stop])
        writer.add_flat(np.asarray(ids[start:stop]), lengths[first:last], mask)
        first, start = last, stop


def _part_masks(part: Path, name: str) -> np.ndarray:
    path = part / f"{name}.mask"
    if not path.is_file():
        raise UserError(
            f"--merge: {part} has no {path.name}, the loss masks of its rows (a part made by another version); delete {part} and submit again"
        )
    return np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint8)


def _part_dir(work: Path, index: int) -> Path:
    return work / PARTS / f"part-{index:05d}"


def _read_plan(work: Path) -> ArrayPlan:
    path = work / PLAN
    try:
        return ArrayPlan(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"--work: {path} is missing or damaged ({exc}); run supertune prepare --submit again") from None


def _load_config(work: Path) -> RunConfig:
    from ..config import load_saved_config

    return load_saved_config(work / CONFIG)


def _source_stats(cfg: RunConfig) -> list[list[Any]]:
    from ..documents.sources import training_files, validation_files
    from ..file_formats import expand_files

    d = cfg.data
    if d.dataset_name:
        return [["dataset", d.dataset_name, d.dataset_config]]
    files = expand_files(training_files(d) + validation_files(d))
    return [[f, os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
