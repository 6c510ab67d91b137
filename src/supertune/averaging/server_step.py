"""The optional server step after averaging: the averaged change from the previous global model is
applied by a server optimizer (FedAvgM, Nesterov momentum, FedAdam, FedYogi, FedAdagrad; formulas in
server_optimizers.py and docs/federated/server-optimizers.md), tensor slice by tensor slice.

The optimizer's state is kept in float32 safetensors files beside the global model it belongs to:
the first moment (FedAvgM's and Nesterov's momentum v, the adaptive optimizers' m) in
server-momentum.safetensors, the adaptive optimizers' second moment s in
server-second-moment.safetensors. By default both are written inside the output directory, so that
they are published together with the model, by the same rename, and the next round finds them
beside its global model. Each file records the optimizer that wrote it (its safetensors metadata),
so that one optimizer's state is never read as another's.
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
from .server_optimizers import (
    DEFAULT_SERVER_OPTIMIZER,
    SERVER_OPTIMIZERS,
    default_lr,
    default_momentum,
    moments_kept,
    step_slice,
)

__all__ = [
    "MOMENTUM_FILE",
    "SECOND_MOMENT_FILE",
    "ServerStep",
    "ServerState",
    "holds_server_state",
    "second_moment_file",
]

MOMENTUM_FILE = "server-momentum.safetensors"
SECOND_MOMENT_FILE = "server-second-moment.safetensors"
_OPTIMIZER_KEY = "supertune_server_optimizer"


def second_moment_file(momentum: Path) -> Path:
    """Where the second moment lives beside a first-moment file: server-momentum.safetensors ->
    server-second-moment.safetensors; any other m.safetensors -> m.second-moment.safetensors."""
    momentum = Path(momentum)
    if momentum.name == MOMENTUM_FILE:
        return momentum.with_name(SECOND_MOMENT_FILE)
    return momentum.with_name(momentum.name.removesuffix(".safetensors") + ".second-moment.safetensors")


def holds_server_state(path: Path) -> bool:
    """Whether `path` is a server optimizer's state file supertune wrote (its safetensors metadata
    names the optimizer): the only file `--momentum-out` may replace."""
    from ..errors import UserError
    from ..weight_files.tensor_files import read_header

    try:
        return _OPTIMIZER_KEY in read_header(Path(path))[1]
    except (OSError, ValueError, UserError):
        return False


@dataclass(frozen=True)
class ServerStep:
    """Settings of the server step: the previous global model, the optimizer and its hyper-parameters,
    and where its state is read from and written to."""

    global_model: Path
    """The previous round's global model (any MODEL form: a model directory, a run, a checkpoint)."""
    lr: float | None = None
    """Server learning rate; None: the optimizer's default (fedavgm 1, which applies the averaged change as it is)."""
    momentum: float | None = None
    """Momentum (beta1) in [0, 1); None: the optimizer's default (fedavgm 0, which keeps no momentum file)."""
    momentum_in: Path | None = None
    """First moment of the previous round; None: <global model>/server-momentum.safetensors if it exists, else zero."""
    momentum_out: Path | None = None
    """Where the new first moment goes; None: <output>/server-momentum.safetensors (published with the output).
    The second moment (adaptive optimizers) is read and written beside it (second_moment_file)."""
    optimizer: str = DEFAULT_SERVER_OPTIMIZER
    """A name of server_optimizers.SERVER_OPTIMIZERS."""
    beta2: float = 0.99
    """Decay of the second moment (fedadam, fedyogi)."""
    tau: float = 1e-3
    """Adaptivity (fedadam, fedyogi, fedadagrad): added to sqrt(s); the second moment starts at tau^2."""

    @property
    def server_lr(self) -> float:
        return default_lr(self.optimizer) if self.lr is None else self.lr

    @property
    def server_momentum(self) -> float:
        return default_momentum(self.optimizer) if self.momentum is None else self.momentum

    def problems(self) -> list[str]:
        out = []
        if self.optimizer not in SERVER_OPTIMIZERS:
            return [f"--server-optimizer: {self.optimizer!r} is not one of {', '.join(SERVER_OPTIMIZERS)}"]
        if not (math.isfinite(self.server_lr) and self.server_lr > 0):
            out.append(f"--server-lr: {self.lr} must be a positive number (1 applies the averaged change as it is)")
        if not (math.isfinite(self.server_momentum) and 0 <= self.server_momentum < 1):
            out.append(f"--server-momentum: {self.momentum} must be in [0, 1) (0.9 is usual; 0 keeps no momentum)")
        if not (math.isfinite(self.beta2) and 0 <= self.beta2 < 1):
            out.append(f"--server-beta2: {self.beta2} must be in [0, 1) (0.99 is usual)")
        if not (math.isfinite(self.tau) and self.tau > 0):
            out.append(f"--server-tau: {self.tau} must be a positive number (1e-3 is usual)")
        if self.momentum_in is not None and not Path(self.momentum_in).is_file():
            out.append(f"--momentum-in: {self.momentum_in} is not a file; leave it out to start from zero momentum")
        return out


class ServerState:
    """The open previous global model and optimizer state of one server step."""

    def __init__(self, step: ServerStep) -> None:
        self.step = step
        self.optimizer = step.optimizer
        self.lr, self.momentum = step.server_lr, step.server_momentum
        self.moments = moments_kept(self.optimizer, self.momentum)
        self.global_model: ModelInput = resolve_input(step.global_model)
        path = step.momentum_in
        if path is None and (self.global_model.directory / MOMENTUM_FILE).is_file():
            path = self.global_model.directory / MOMENTUM_FILE
        self.momentum_in_path: Path | None = Path(path).absolute() if path is not None and self.moments else None
        self.second_in_path: Path | None = (
            second_moment_file(self.momentum_in_path) if self.momentum_in_path and self.moments == 2 else None
        )
        self.momentum_in = self._open(self.momentum_in_path)
        self.second_in = (
            self._open(self.second_in_path) if self.second_in_path and self.second_in_path.is_file() else None
        )
        self.writer: ShardWriter | None = None
        self.second_writer: ShardWriter | None = None
        self._scratch: dict[tuple[str, str], np.ndarray] = {}

    @staticmethod
    def _open(path: Path | None) -> WeightFiles | None:
        return WeightFiles(path.parent, path.name) if path is not None else None

    @property
    def keeps_momentum(self) -> bool:
        return self.moments > 0

    @property
    def state_in_paths(self) -> list[Path]:
        """The state files read (hashed for the manifest)."""
        return [p for p in (self.momentum_in_path, self.second_in_path) if p is not None]

    def problems(self, planned: list[PlannedTensor], averaged: set[str]) -> list[str]:
        """The previous global model must hold every averaged tensor in its shape (any float dtype);
        the state files every averaged tensor as float32, written by the same optimizer."""
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
        if self.second_in_path is not None and self.second_in is None:
            out.append(
                f"--momentum-in {self.momentum_in_path}: the second moment of {self.optimizer} belongs beside it as "
                f"{self.second_in_path.name} and is missing; give both files of the state, or neither to start afresh"
            )
        for files, path in ((self.momentum_in, self.momentum_in_path), (self.second_in, self.second_in_path)):
            if files is None:
                continue
            written_by = next(iter(files.files.values())).metadata.get(_OPTIMIZER_KEY, "fedavgm")
            if written_by != self.optimizer:
                out.append(
                    f"--momentum-in {path}: holds the state of server optimizer {written_by}, not {self.optimizer}; "
                    f"use --server-optimizer {written_by}, or a global model without {path.name} to start {self.optimizer} afresh"
                )
                continue
            have = files.where
            for t in planned:
                if t.name in averaged and (
                    t.name not in have or have[t.name][1].shape != t.shape or have[t.name][1].dtype != "F32"
                ):
                    out.append(
                        f"--momentum-in {path}: no float32 tensor {t.name} {list(t.shape)}; it is not the state of this model"
                    )
                    break
        return out

    def open_writer(self, path: Path, second_path: Path, planned: list[PlannedTensor], averaged: set[str]) -> None:
        """Writers of the new state: the first moment at `path`, the second at `second_path` (adaptive optimizers)."""
        state = [PlannedTensor(t.name, "F32", t.shape) for t in planned if t.name in averaged]
        metadata = {"format": "pt", _OPTIMIZER_KEY: self.optimizer}
        if self.moments:
            self.writer = ShardWriter(path, state, metadata)
        if self.moments == 2:
            self.second_writer = ShardWriter(second_path, state, metadata)

    def _buffer(self, role: str, dtype: np.dtype, n: int) -> np.ndarray:
        key = (role, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None or buf.size < n:
            buf = self._scratch[key] = np.empty(n, dtype=dtype)
        return buf[:n]

    def _read_state(self, files: WeightFiles | None, name: str, start: int, stop: int, out: np.ndarray) -> bool:
        """Copy the slice of a state tensor into `out`; False when there is no state yet. ValueError on NaN or Inf."""
        if files is None:
            return False
        np.copyto(out, files.rows(name, start, stop))
        files.release(name, start, stop)
        if not np.isfinite(out).all():
            raise ValueError(name)
        return True

    def apply(self, name: str, start: int, stop: int, acc: np.ndarray, g: np.ndarray, tmp: np.ndarray) -> str | None:
        """Turn the average `acc` of elements [start, stop) into the new global model's, in place, and
        write the new state; `g` and `tmp` are scratch buffers of acc's size and dtype. Returns a
        problem when the global model or the state holds NaN or Inf there."""
        entry = self.global_model.weights.entry(name)
        widen_into(self.global_model.weights.rows(name, start, stop), entry.dtype, g)
        self.global_model.weights.release(name, start, stop)
        if not np.isfinite(g).all():
            return f"--global-model {self.step.global_model}: tensor {name} has NaN or Inf values; give a sound global model"
        second = self._buffer("second", acc.dtype, acc.size) if self.moments == 2 else tmp
        scratch = self._buffer("scratch", acc.dtype, acc.size)
        try:
            have = self._read_state(self.momentum_in, name, start, stop, tmp)
            if self.moments == 2 and have:
                self._read_state(self.second_in, name, start, stop, second)
        except ValueError:
            return f"--momentum-in {self.momentum_in_path}: tensor {name} has NaN or Inf values in the server optimizer's state"
        s = self.step
        step_slice(self.optimizer, self.lr, self.momentum, s.beta2, s.tau, acc, g, tmp, second, scratch, have)
        if self.writer is not None:
            self.writer.write(tmp.astype(np.float32, copy=False))
        if self.second_writer is not None:
            self.second_writer.write(second.astype(np.float32, copy=False))
        return None

    def close(self) -> None:
        self.global_model.weights.close()
        for files in (self.momentum_in, self.second_in):
            if files is not None:
                files.close()
        for writer in (self.writer, self.second_writer):
            if writer is not None:
                writer.abort()
