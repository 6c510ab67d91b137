"""output.dtype: a saved full model's floating-point tensors cast after the save, whatever the
training precision (a bf16 mixed-precision run saved in fp16, 13 GB instead of 26 for an 8B model).

The cast works on the files the save wrote, so it is the same for every strategy: under ZeRO-3 and
FSDP they hold the state gathered on the main process, under ddp the unwrapped model's. Each
safetensors file is read memory-mapped and rewritten beside itself a slice of a tensor at a time
(the numpy conversions of `supertune average`, rounding to nearest even), so memory stays at a few
buffers whatever the model's size; the rewritten files replace the originals only when every file
of the model is written and every value fits the new dtype. config.json's dtype is set to match,
so that `from_pretrained` loads the model in it. Costs one read and one write of the saved model on
the main process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...rundir import write_json_atomic
from ...weight_files.dtypes import AVERAGED, ITEM_SIZE, OUTPUT_DTYPES, accumulator_dtype, narrow, widen_into
from ...weight_files.shard_writer import PlannedTensor, ShardWriter
from ...weight_files.tensor_files import INDEX_SUFFIX, TensorFile, WeightFiles

__all__ = ["cast_saved_model", "CONFIG_DTYPE_NAMES"]

CONFIG_DTYPE_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
"""safetensors dtype -> the name config.json's dtype gives it."""

_WEIGHTS = "model.safetensors"
_SLICE = 1 << 20  # elements converted at a time: 4 MB of float32


def cast_saved_model(directory: Path, choice: str) -> str | None:
    """Cast every floating-point tensor of the full model saved in `directory` to output.dtype `choice`
    ("same" leaves it as saved). Returns the config.json dtype name written, or None when nothing was
    cast (same, or a directory without full weights, such as LoRA adapters)."""
    target = OUTPUT_DTYPES[choice]
    directory = Path(directory)
    index = directory / f"model{INDEX_SUFFIX}"
    name = index.name if index.is_file() else _WEIGHTS
    if target is None or not (directory / name).is_file():
        return None
    weights = WeightFiles(directory, name)
    staged: list[tuple[Path, Path]] = []
    data_bytes = 0
    try:
        for file_name, tensor_file in weights.files.items():
            temporary = directory / f".{file_name}.cast-{os.getpid()}"
            staged.append((temporary, directory / file_name))
            data_bytes += _rewrite(tensor_file, target, temporary)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
    finally:
        weights.close()
    for temporary, final in staged:
        os.replace(temporary, final)
    if index.is_file():
        _update_index_size(index, data_bytes)
    _set_config_dtype(directory / "config.json", CONFIG_DTYPE_NAMES[target])
    return CONFIG_DTYPE_NAMES[target]


def _rewrite(source: TensorFile, target: str, path: Path) -> int:
    """One safetensors file with its floating tensors in `target`, the others copied byte for byte;
    returns the bytes of its tensors."""
    entries = sorted(source.tensors.values(), key=lambda e: e.begin)
    planned = [PlannedTensor(e.name, target if e.dtype in AVERAGED else e.dtype, e.shape) for e in entries]
    # Larger elements first (stable), so that every tensor starts aligned to its element size.
    order = sorted(range(len(planned)), key=lambda i: -ITEM_SIZE[planned[i].dtype])
    writer = ShardWriter(path, [planned[i] for i in order], source.metadata or None)
    try:
        buffers = _Buffers()
        for i in order:
            entry, out = entries[i], planned[i]
            for start in range(0, entry.numel, _SLICE):
                stop = min(entry.numel, start + _SLICE)
                raw = source.rows(entry, start, stop)
                writer.write(
                    raw if out.dtype == entry.dtype else _converted(raw, entry.dtype, target, entry.name, buffers)
                )
                source.release(entry, start, stop)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return writer.data_bytes


class _Buffers:
    """Reused conversion buffers, grown to the largest slice seen."""

    def __init__(self) -> None:
        self.size = 0
        self.wide = np.empty(0, dtype=np.float32)

    def get(self, n: int, wide: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if n > self.size or self.wide.dtype != wide:
            self.size = max(n, self.size)
            self.wide = np.empty(self.size, dtype=wide)
            self.scratch = np.empty(self.size, dtype=np.uint32)
            self.out16 = np.empty(self.size, dtype=np.uint16)
        return self.wide[:n], self.scratch, self.out16


def _converted(raw: np.ndarray, dtype: str, target: str, name: str, buffers: _Buffers) -> np.ndarray:
    wide, scratch, out16 = buffers.get(raw.size, accumulator_dtype(dtype))
    widen_into(raw, dtype, wide)
    values, finite = narrow(wide, target, scratch, out16)
    if not finite and bool(np.isfinite(wide).all()):
        largest = float(np.abs(wide).max())
        raise UserError(
            f"output.dtype: tensor {name!r} has values up to {largest:.4g}, beyond what {target} can hold "
            f"(fp16: 65504); the model stays saved as trained; use output.dtype=bf16 or same"
        )
    return values


def _update_index_size(index: Path, data_bytes: int) -> None:
    data = json.loads(index.read_text(encoding="utf-8"))
    data.setdefault("metadata", {})["total_size"] = data_bytes
    write_json_atomic(index, data)


def _set_config_dtype(path: Path, dtype_name: str) -> None:
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    config["dtype"] = dtype_name
    if "torch_dtype" in config:  # older transformers name the same thing so
        config["torch_dtype"] = dtype_name
    write_json_atomic(path, config)
