"""A site's result as it travels to the aggregator: a transfer package.

A package is a directory: `transfer.safetensors` (every tensor encoded by the codec: the model's
values, or with `delta` their change from the round's global model), the model's small side files
(config, tokenizer, adapter config), `residual.safetensors` (error feedback: what the codec lost,
kept at the site and added to the next round's change; never sent) and `supertune-transfer.json`,
written last, which names the settings, the source's tensors (dtype and shape), the base the
change is relative to (its weight files' sha256) and the size and sha256 of every file sent.

Writing reads the source, the base and the previous residual a slice at a time and writes each
encoded slice as it is computed: resident memory is a few slices whatever the model's size. The
encoded file lays its tensors out by element size, largest first (as every safetensors writer of
supertune does, for aligned maps), so an int8 or int4 tensor's scales are written in a first pass
over its values and its integers in a second (the change is computed twice: a read more, no memory more).
With privacy settings the change is clipped and noised (privacy.py) before it is encoded: its norm over
every tensor is measured in a first pass (one read more), and the manifest states the clip norm and
the noise's standard deviation, never the norm.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..checkpoints.faults import fault_point
from ..errors import UserError
from ..file_table import sha256_files, size_and_sha256, table_problems
from ..output_dirs import Staging
from ..weight_files.dtypes import ITEM_SIZE, accumulator_dtype, narrow, widen_into
from ..weight_files.shard_writer import PlannedTensor, ShardWriter, plan_shards
from ..weight_files.tensor_files import TensorEntry, TensorFile
from .codec import CODECS, FLOAT_DTYPES, SCALE_SUFFIX, Codec, encoded_parts
from .privacy import ChangeNoise

__all__ = [
    "PACKAGE_MANIFEST",
    "PACKAGE_WEIGHTS",
    "RESIDUAL_FILE",
    "Package",
    "PackageWeights",
    "Weights",
    "package_problems",
    "read_package",
    "weights_digest",
    "write_package",
]

PACKAGE_MANIFEST = "supertune-transfer.json"
PACKAGE_WEIGHTS = "transfer.safetensors"
RESIDUAL_FILE = "residual.safetensors"
FORMAT = 1
SLICE = 1 << 20
"""Elements encoded or decoded at a time (4 MB of float32)."""


class Weights(Protocol):
    """What the package reads weights through: supertune.weight_files.WeightFiles, an FSDP checkpoint's shards."""

    where: dict[str, tuple[Any, TensorEntry]]
    paths: list[Path]

    def entry(self, name: str) -> TensorEntry: ...
    def rows(self, name: str, start: int, stop: int) -> np.ndarray: ...
    def release(self, name: str, start: int, stop: int) -> None: ...
    def in_file_order(self) -> list[str]: ...


@dataclass(frozen=True)
class Package:
    """A package's manifest, read and checked for shape (not yet against its files)."""

    directory: Path
    codec: Codec
    delta: bool
    base: dict[str, str] | None
    """With delta: the base's weight files (name -> sha256) the change was taken from."""
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    """Source tensor name -> (dtype, shape), in the source's order."""
    files: dict[str, dict[str, Any]]
    """What is sent: name -> {size, sha256}."""
    residual: dict[str, Any] | None
    counts: dict[str, Any]
    """tokens, samples, loss_tokens and whatever else the writer was given to carry."""
    privacy: dict[str, float] | None = None
    """With privacy: the clip_norm the change was clipped to and the noise_std added to each value."""

    @property
    def sent_weight_bytes(self) -> int:
        return int(self.files[PACKAGE_WEIGHTS]["size"])


def weights_digest(weights: Weights) -> dict[str, str]:
    """name -> sha256 of the files `weights` are read from: what a delta names as its base."""
    paths = list(weights.paths)
    return {p.name: d for p, d in zip(paths, sha256_files(paths))}


def write_package(
    out: Path,
    source: Weights,
    codec: Codec,
    *,
    base: Weights | None,
    base_digest: dict[str, str] | None = None,
    residual: TensorFile | None = None,
    side_files: Sequence[Path] = (),
    counts: dict[str, Any] | None = None,
    label: str = "",
    privacy: ChangeNoise | None = None,
) -> Package:
    """Encode `source` (with `base`: its change from `base`, plus the previous `residual`) into the
    package directory `out`, published whole by one rename; `label` names the site in errors. With
    `privacy` (and a base), the change is clipped and noised before it is encoded (privacy.py)."""
    names = source.in_file_order()
    if base is not None:
        _check_same_tensors(source, base, label, "the round's global model")
    if residual is not None:
        _check_residual(source, residual, label)
    if privacy is not None:
        _check_private(source, base, label)
    parts: list[PlannedTensor] = []
    for name in names:
        e = source.entry(name)
        parts += encoded_parts(codec, name, e.dtype, e.numel)
    planned = plan_shards(parts, max_bytes=1 << 62)[0]
    feedback = base is not None and any(not codec.lossless(source.entry(n).dtype) for n in names)
    values_in_order = [p.name for p in planned if not p.name.endswith(SCALE_SUFFIX)]
    floats = [n for n in values_in_order if source.entry(n).dtype in FLOAT_DTYPES]
    kept = [PlannedTensor(n, "F32", source.entry(n).shape) for n in floats] if feedback else []
    with Staging(out, "transfer package", replace=True) as staging:
        writer = ShardWriter(staging.path / PACKAGE_WEIGHTS, planned, metadata={"format": "supertune-transfer"})
        kept_writer = ShardWriter(staging.path / RESIDUAL_FILE, kept) if kept else None
        try:
            encoder = _Encoder(source, base, residual, codec, label)
            if privacy is not None:
                encoder.privatise(privacy)
            for index, part in enumerate(planned, start=1):
                if part.name.endswith(SCALE_SUFFIX):
                    encoder.scales(part.name.removesuffix(SCALE_SUFFIX), writer)
                else:
                    encoder.values(part.name, writer, kept_writer)
                fault_point("transfer.tensor", index, 0)
            sent = {PACKAGE_WEIGHTS: writer.finish()}
            kept_file = kept_writer.finish() if kept_writer else None
        except BaseException:
            writer.abort()
            if kept_writer:
                kept_writer.abort()
            raise
        for path in side_files:
            shutil.copyfile(path, staging.path / path.name)
            sent[path.name] = size_and_sha256(staging.path / path.name)
        manifest = {
            "format": FORMAT,
            "kind": "transfer",
            "codec": codec.name,
            "block_size": codec.block_size,
            "delta": base is not None,
            "base": (base_digest or weights_digest(base)) if base is not None else None,
            "tensors": {n: {"dtype": source.entry(n).dtype, "shape": list(source.entry(n).shape)} for n in names},
            "files": sent,
            "residual": ({"file": RESIDUAL_FILE, **kept_file} if kept_file else None),
            "counts": dict(counts or {}),
        }
        if privacy is not None:  # the settings, never the change's norm: that is the site's to know
            manifest["privacy"] = {"clip_norm": privacy.clip_norm, "noise_std": privacy.noise_std}
        (staging.path / PACKAGE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        staging.publish()
    return read_package(out)


def _check_same_tensors(source: Weights, other: Weights, label: str, what: str) -> None:
    a, b = source.where, other.where
    if set(a) != set(b):
        odd = sorted(set(a) ^ set(b))
        raise UserError(f"{label}: its model and {what} hold different tensors (e.g. {odd[0]}); they must be one model")
    for n in a:
        if (a[n][1].shape, a[n][1].dtype) != (b[n][1].shape, b[n][1].dtype):
            raise UserError(
                f"{label}: tensor {n} is {a[n][1].dtype}{list(a[n][1].shape)} in its model but "
                f"{b[n][1].dtype}{list(b[n][1].shape)} in {what}; they must be one model"
            )


def _check_private(source: Weights, base: Weights | None, label: str) -> None:
    """A change can be clipped and noised; a model, or a tensor that travels as it is, cannot."""
    if base is None:
        raise UserError(f"{label}: privacy clips and noises a change from the round's global model, and none was given")
    for name in source.where:
        if source.entry(name).dtype not in FLOAT_DTYPES:
            raise UserError(
                f"{label}: tensor {name} is {source.entry(name).dtype}, which travels as it is and cannot be noised; "
                "privacy needs a model of floating-point tensors only"
            )


def _check_residual(source: Weights, residual: TensorFile, label: str) -> None:
    for name in source.where:
        e = source.entry(name)
        if e.dtype not in FLOAT_DTYPES:
            continue
        r = residual.tensors.get(name)
        if r is None or r.shape != e.shape or r.dtype != "F32":
            raise UserError(
                f"{label}: the residual kept from its last round ({residual.path}) does not fit its model "
                f"(tensor {name}); delete that file to start the error feedback again"
            )


class _Encoder:
    """The change (or the model) of each float tensor, a slice at a time, as the codec stores it."""

    def __init__(self, source: Weights, base: Weights | None, residual: TensorFile | None, codec: Codec, label: str):
        self.source, self.base, self.residual, self.codec, self.label = source, base, residual, codec, label
        self.privacy: ChangeNoise | None = None
        self.factor = 1.0

    def privatise(self, privacy: ChangeNoise) -> None:
        """From now on the change is clipped and noised: its norm over every tensor measured first (one
        more read of the source, the base and the residual)."""
        squares = 0.0
        for name in self.source.in_file_order():
            for start, stop in self._slices(self.source.entry(name).numel):
                x = self._change(name, start, stop).astype(np.float64, copy=False)
                squares += float(np.dot(x, x))
        self.factor = privacy.measure(squares)
        self.privacy = privacy

    def _slices(self, numel: int) -> list[tuple[int, int]]:
        step = self.codec.slice_length(SLICE)
        return [(s, min(numel, s + step)) for s in range(0, numel, step)]

    def _change(self, name: str, start: int, stop: int) -> np.ndarray:
        """Source minus base plus the previous residual (or the source itself), widened."""
        e = self.source.entry(name)
        acc = accumulator_dtype(e.dtype)
        x = widen_into(self.source.rows(name, start, stop), e.dtype, np.empty(stop - start, acc))
        self.source.release(name, start, stop)
        if self.base is not None:
            g = widen_into(self.base.rows(name, start, stop), e.dtype, np.empty(stop - start, acc))
            self.base.release(name, start, stop)
            x -= g
        if self.residual is not None:
            entry = self.residual.tensors[name]
            x += self.residual.rows(entry, start, stop)
            self.residual.release(entry, start, stop)
        if not np.isfinite(x).all():
            what = "change" if self.base is not None else "model"
            raise UserError(f"{self.label}: tensor {name} of its {what} has NaN or Inf values; it is not sent")
        if self.privacy is not None:  # a factor of 1 and no noise leave the change as it is, bit for bit
            if self.factor != 1.0:
                x *= x.dtype.type(self.factor)
            if self.privacy.noise_std:
                x += self.privacy.noise(name, e.numel, start, stop)
        return x

    def scales(self, name: str, writer: ShardWriter) -> None:
        for start, stop in self._slices(self.source.entry(name).numel):
            writer.write(self.codec.block_scales(self._change(name, start, stop)))

    def values(self, name: str, writer: ShardWriter, kept: ShardWriter | None) -> None:
        e = self.source.entry(name)
        if e.dtype not in FLOAT_DTYPES:  # counters, indices: as they are
            for start, stop in self._slices(e.numel):
                writer.write(np.array(self.source.rows(name, start, stop)))
                self.source.release(name, start, stop)
            return
        for start, stop in self._slices(e.numel):
            change = self._change(name, start, stop)
            stored, decoded = self.codec.encode(change, e.dtype)
            writer.write(stored)
            if kept is not None:
                kept.write((change - decoded).astype(np.float32))


def read_package(directory: Path, label: str | None = None) -> Package:
    """The manifest of the package in `directory`; UserError naming it when it is not one."""
    label = label or str(directory)
    path = Path(directory) / PACKAGE_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        codec = Codec(str(data["codec"]), int(data["block_size"]))
        tensors = {str(n): (str(t["dtype"]), tuple(int(x) for x in t["shape"])) for n, t in data["tensors"].items()}
        files = {str(k): {"size": int(v["size"]), "sha256": str(v["sha256"])} for k, v in data["files"].items()}
        package = Package(
            directory=Path(directory),
            codec=codec,
            delta=bool(data["delta"]),
            base={str(k): str(v) for k, v in data["base"].items()} if data["base"] else None,
            tensors=tensors,
            files=files,
            residual=data.get("residual"),
            counts=dict(data.get("counts") or {}),
            privacy={str(k): float(v) for k, v in data["privacy"].items()} if data.get("privacy") else None,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(
            f"{label}: {PACKAGE_MANIFEST} is missing or unreadable ({exc}); the package is damaged"
        ) from None
    if data.get("format") != FORMAT or codec.name not in CODECS or codec.block_size < 2 or codec.block_size % 2:
        raise UserError(f"{label}: {PACKAGE_MANIFEST} is not a transfer package this supertune reads")
    if PACKAGE_WEIGHTS not in files or any(Path(f).name != f for f in files):
        raise UserError(f"{label}: {PACKAGE_MANIFEST} names files outside the package or no {PACKAGE_WEIGHTS}")
    return package


def package_problems(package: Package, hashes: bool = True) -> list[str]:
    """What of the package's sent files does not match its manifest (sizes, then sha256)."""
    return table_problems(package.directory, package.files, hashes=hashes)


class PackageWeights:
    """A package read back as the source's tensors, with the interface of weight_files.WeightFiles:
    elements [start, stop) of a tensor are decoded (and added to the base's) from the blocks that
    hold them, and given in the source's dtype."""

    def __init__(self, package: Package, base: Weights | None, label: str) -> None:
        self.package = package
        self.label = label
        self.file = TensorFile(package.directory / PACKAGE_WEIGHTS)
        self.base = base
        self.index: Path | None = None
        self.where: dict[str, tuple[Any, TensorEntry]] = {}
        stored = self.file.tensors
        codec = package.codec
        for name, (dtype, shape) in package.tensors.items():
            numel = math.prod(shape)
            want = {p.name: p for p in encoded_parts(codec, name, dtype, numel)}
            for part, plan in want.items():
                got = stored.get(part)
                if got is None or (got.dtype, got.shape) != (plan.dtype, plan.shape):
                    raise UserError(
                        f"{label}: {PACKAGE_WEIGHTS} does not hold {part} as its manifest says; the package is damaged"
                    )
            self.where[name] = (self, TensorEntry(name, dtype, shape, 0, numel * ITEM_SIZE[dtype]))
        if package.delta:
            if base is None:
                raise UserError(f"{label}: a change from a base model, and no base was given")
            _check_same_tensors(self, base, label, "its base")

    @property
    def paths(self) -> list[Path]:
        return [self.file.path]

    @property
    def total_bytes(self) -> int:
        return sum(entry.end - entry.begin for _, entry in self.where.values())

    def entry(self, name: str) -> TensorEntry:
        return self.where[name][1]

    def in_file_order(self) -> list[str]:
        return list(self.package.tensors)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        entry = self.entry(name)
        stored = self.file.tensors[name]
        if entry.dtype not in FLOAT_DTYPES:
            return self.file.rows(stored, start, stop)
        codec, n = self.package.codec, stop - start
        acc = np.empty(n, accumulator_dtype(entry.dtype))
        first, last, skip = codec.stored_range(start, stop)
        scales = None
        if codec.blockwise:
            size = codec.block_size
            scales = self.file.rows(self.file.tensors[name + SCALE_SUFFIX], start // size, -(-stop // size))
        codec.decode_into(self.file.rows(stored, first, last), scales, entry.dtype, skip, acc)
        if self.base is not None:
            acc += widen_into(self.base.rows(name, start, stop), entry.dtype, np.empty(n, acc.dtype))
        values, finite = narrow(acc, entry.dtype, np.empty(n, np.uint32), np.empty(n, np.uint16))
        if not finite:
            raise UserError(f"{self.label}: tensor {name} has values beyond the range of {entry.dtype} once decoded")
        return values

    def release(self, name: str, start: int, stop: int) -> None:
        stored = self.file.tensors[name]
        if self.entry(name).dtype in FLOAT_DTYPES:
            first, last, _ = self.package.codec.stored_range(start, stop)
            self.file.release(stored, first, last)
        else:
            self.file.release(stored, start, stop)
        if self.base is not None:
            self.base.release(name, start, stop)

    def close(self) -> None:
        self.file.close()
