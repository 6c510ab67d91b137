"""An FSDP run's sharded checkpoint as an input of an average: its tensors under the names a saved
model gives them, read one whole tensor at a time.

The checkpoint's `fsdp_model/` holds the model's state dict, every tensor split over the ranks that
wrote it (supertune.distributed.fsdp_checkpoint). Its names are the state dict's, tied tensors under
each of their names; the average must see what `save_pretrained` would have written (the run's
gathered final model/), so the names come from the model that the checkpoint's config.json builds
on the meta device (supertune.modeling.saved_tensors): the kept ones are read, the other names of a
tied tensor are not. Every stored name must be one of that model's, with its shape, or the
checkpoint is refused (a LoRA run's shards, say, which are keyed by peft's names).

Reading: a tensor is assembled whole from every rank's slices (DCP, in this process, no process
group) when the average first asks for a slice of it, served as numpy views on it, and dropped once
its last slice was used. Resident memory per sharded input is therefore one tensor (the embedding
matrix is usually the largest) plus the stored slice being copied, where a safetensors input holds
one 4 MB slice; torch is imported only when an input is sharded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..distributed.fsdp_checkpoint import MODEL_DIR, FullTensorReader, sharded_model_files
from ..errors import UserError, first_line
from ..modeling.saved_tensors import saved_tensors
from ..weight_files.dtypes import ITEM_SIZE
from ..weight_files.tensor_files import TensorEntry

__all__ = ["ShardedWeights"]

# torch dtype name -> safetensors dtype name (those averaging reads; see weight_files.dtypes)
_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


class ShardedWeights:
    """The tensors of an FSDP sharded checkpoint, with the interface of weight_files.WeightFiles."""

    def __init__(self, checkpoint: Path, label: str) -> None:
        """`label`: how messages name the input ("MODEL <arg>"). UserError when it cannot be read as a saved model."""
        self.directory = Path(checkpoint)
        self.label = label
        self.index: Path | None = None
        self.where: dict[str, tuple[Any, TensorEntry]] = {}
        self._current: tuple[str, Any, np.ndarray] | None = None
        try:
            self._reader = FullTensorReader(self.directory)
        except Exception as exc:  # DCP unpickles .metadata: any damage surfaces as some exception
            raise self._damaged(f"{MODEL_DIR}/.metadata is unreadable ({first_line(exc)})") from None
        try:
            saved = saved_tensors(self.directory)
        except ValueError as exc:
            raise self._refused(str(exc)) from None
        stored = self._reader.tensors
        problem = _names_problem(stored, saved.kept, saved.left_out)
        if problem:
            raise self._refused(problem)
        for name, shape in saved.kept.items():
            torch_dtype = stored[name][0]
            dtype = _DTYPES.get(str(torch_dtype).removeprefix("torch."))
            if dtype is None:
                raise self._refused(f"tensor {name} is {torch_dtype}, which averaging does not read")
            self.where[name] = (self, TensorEntry(name, dtype, shape, 0, math.prod(shape) * ITEM_SIZE[dtype]))

    def _refused(self, why: str) -> UserError:
        return UserError(
            f"{self.label}: an FSDP sharded checkpoint whose tensors cannot be read as a saved model: {why}; "
            "average that run's final model/ instead"
        )

    def _damaged(self, why: str) -> UserError:
        return UserError(f"{self.label}: {why}; the checkpoint is damaged, average another one")

    @property
    def paths(self) -> list[Path]:
        """The files read: fsdp_model/.metadata and every rank's file (hashed against the manifest)."""
        return sharded_model_files(self.directory)

    @property
    def total_bytes(self) -> int:
        return sum(entry.end - entry.begin for _, entry in self.where.values())

    def entry(self, name: str) -> TensorEntry:
        return self.where[name][1]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of tensor `name`, flat, as stored (bf16 as its bits); the whole tensor is read first."""
        if self._current is None or self._current[0] != name:
            self._current = None  # the previous tensor goes before the next one is read
            entry = self.entry(name)
            try:
                tensor = self._reader.read(name)
            except ValueError as exc:
                raise self._damaged(f"tensor {name} could not be read from {MODEL_DIR}/ ({exc})") from None
            flat = tensor.reshape(-1)
            if entry.dtype == "BF16":  # numpy has no bfloat16: its bits, as weight_files reads them
                import torch

                values = flat.view(torch.int16).numpy().view(np.uint16)
            else:
                values = flat.numpy()
            self._current = (name, tensor, values)
        return self._current[2][start:stop]

    def release(self, name: str, start: int, stop: int) -> None:
        """Drop the tensor once its last slice was used."""
        if self._current is not None and self._current[0] == name and stop >= self.entry(name).numel:
            self._current = None

    def in_file_order(self) -> list[str]:
        """The tensors in the order the model holds them (the order they were saved)."""
        return list(self.where)

    def close(self) -> None:
        self._current = None


def _names_problem(
    stored: dict[str, tuple[Any, tuple[int, ...]]], kept: dict[str, tuple[int, ...]], left_out: tuple[str, ...]
) -> str | None:
    """What is wrong with the stored tensors against the model the config builds, in one line; None when they match."""
    expected = set(kept) | set(left_out)
    unknown = [n for n in stored if n not in expected]
    if unknown:
        lora = (
            " (LoRA adapters: the run's final model/ holds them as peft saves them)"
            if any("lora_" in n for n in unknown)
            else ""
        )
        return f"{len(unknown)} stored tensor(s) are not the config's model's, e.g. {unknown[0]}{lora}"
    missing = [n for n in kept if n not in stored]
    if missing:
        return f"{len(missing)} tensor(s) of the config's model are not stored, e.g. {missing[0]}"
    for name, shape in kept.items():
        if stored[name][1] != shape:
            return f"tensor {name} is stored as {list(stored[name][1])}, the config's model has {list(shape)}"
    return None
