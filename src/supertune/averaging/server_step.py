"""The optional server step after averaging (FedAvgM): the averaged change from the previous global
model is applied with a server learning rate and momentum, tensor slice by tensor slice.

With g the previous global model, a the weighted average of the inputs, lr the server learning
rate and beta the momentum:

    d     = a - g                  the averaged change the sites made this round
    v     = beta * v_prev + d      v_prev read from the momentum file (zero when there is none yet)
    g_new = g + lr * v

lr = 1 and beta = 0 give g_new = a, plain FedAvg. The momentum v is kept in float32 in a safetensors
file (only when beta > 0), by default inside the output directory, so that it is published together
with the model it belongs to and the next round finds it beside its global model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..weight_files.dtypes import widen_into
from ..weight_files.shard_writer import PlannedTensor, ShardWriter
from ..weight_files.tensor_files import WeightFiles
from .inputs import ModelInput, resolve_input

__all__ = ["MOMENTUM_FILE", "ServerStep", "ServerState"]

MOMENTUM_FILE = "server-momentum.safetensors"


@dataclass(frozen=True)
class ServerStep:
    """Settings of the server step: the previous global model, the server learning rate and momentum, and
    where the momentum is read from and written to."""

    global_model: Path
    """The previous round's global model (any MODEL form: a model directory, a run, a checkpoint)."""
    lr: float = 1.0
    """Server learning rate: 1 applies the averaged change as it is."""
    momentum: float = 0.0
    """Server momentum beta in [0, 1): 0 keeps no momentum (and writes no momentum file)."""
    momentum_in: Path | None = None
    """Momentum of the previous round; None: <global model>/server-momentum.safetensors if it exists, else zero."""
    momentum_out: Path | None = None
    """Where the new momentum goes; None: <output>/server-momentum.safetensors (published with the output)."""

    def problems(self) -> list[str]:
        out = []
        if not (math.isfinite(self.lr) and self.lr > 0):
            out.append(f"--server-lr: {self.lr} must be a positive number (1 applies the averaged change as it is)")
        if not (math.isfinite(self.momentum) and 0 <= self.momentum < 1):
            out.append(f"--server-momentum: {self.momentum} must be in [0, 1) (0.9 is usual; 0 keeps no momentum)")
        if self.momentum_in is not None and not Path(self.momentum_in).is_file():
            out.append(f"--momentum-in: {self.momentum_in} is not a file; leave it out to start from zero momentum")
        return out


class ServerState:
    """The open previous global model and momentum files of one server step."""

    def __init__(self, step: ServerStep) -> None:
        self.step = step
        self.global_model: ModelInput = resolve_input(step.global_model)
        path = step.momentum_in
        if path is None and (self.global_model.directory / MOMENTUM_FILE).is_file():
            path = self.global_model.directory / MOMENTUM_FILE
        self.momentum_in_path: Path | None = Path(path).absolute() if path is not None and step.momentum > 0 else None
        self.momentum_in = (
            WeightFiles(self.momentum_in_path.parent, self.momentum_in_path.name) if self.momentum_in_path else None
        )
        self.writer: ShardWriter | None = None

    @property
    def keeps_momentum(self) -> bool:
        return self.step.momentum > 0

    def problems(self, planned: list[PlannedTensor], averaged: set[str]) -> list[str]:
        """The previous global model must hold every averaged tensor in its shape (any float dtype);
        the momentum file every averaged tensor as float32."""
        out = []
        have = self.global_model.weights.where
        for t in planned:
            if t.name not in averaged:
                continue
            if t.name not in have or have[t.name][1].shape != t.shape:
                got = "lacks it" if t.name not in have else f"has {list(have[t.name][1].shape)}"
                out.append(
                    f"--global-model {self.step.global_model}: tensor {t.name} {list(t.shape)}: the previous global model {got}; "
                    "give the global model these inputs started from"
                )
                break
        if self.momentum_in is not None:
            have = self.momentum_in.where
            for t in planned:
                if t.name in averaged and (
                    t.name not in have or have[t.name][1].shape != t.shape or have[t.name][1].dtype != "F32"
                ):
                    out.append(
                        f"--momentum-in {self.momentum_in_path}: no float32 tensor {t.name} {list(t.shape)}; it is not the momentum of this model"
                    )
                    break
        return out

    def open_writer(self, path: Path, planned: list[PlannedTensor], averaged: set[str]) -> None:
        if self.keeps_momentum:
            self.writer = ShardWriter(
                path, [PlannedTensor(t.name, "F32", t.shape) for t in planned if t.name in averaged]
            )

    def apply(self, name: str, start: int, stop: int, acc: np.ndarray, g: np.ndarray, tmp: np.ndarray) -> str | None:
        """Turn the average `acc` of elements [start, stop) into the new global model's, in place; `g` and
        `tmp` are scratch buffers of acc's size and dtype. Returns a problem when the global model or the
        momentum holds NaN or Inf there."""
        entry = self.global_model.weights.entry(name)
        widen_into(self.global_model.weights.rows(name, start, stop), entry.dtype, g)
        self.global_model.weights.release(name, start, stop)
        if not np.isfinite(g).all():
            return f"--global-model {self.step.global_model}: tensor {name} has NaN or Inf values; give a sound global model"
        np.subtract(acc, g, out=acc)  # d
        if self.keeps_momentum:
            if self.momentum_in is not None:
                np.copyto(tmp, self.momentum_in.rows(name, start, stop))
                self.momentum_in.release(name, start, stop)
                if not np.isfinite(tmp).all():
                    return f"--momentum-in {self.momentum_in_path}: tensor {name} has NaN or Inf values"
                tmp *= self.step.momentum
                acc += tmp  # v = beta * v_prev + d
            self.writer.write(acc.astype(np.float32, copy=False))
        acc *= self.step.lr
        acc += g
        return None

    def close(self) -> None:
        self.global_model.weights.close()
        if self.momentum_in is not None:
            self.momentum_in.close()
        if self.writer is not None:
            self.writer.abort()
