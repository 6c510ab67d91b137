"""The streaming loop: each output tensor computed a slice at a time, written by a thread of its own.

Per slice of about a million elements (CHUNK_ELEMENTS), the main thread reads each input's slice
from its memory-mapped file, widens it to float32 (float64 for float64 tensors), multiplies it by
its weight and adds it up, checks the sum for NaN and Inf, applies the optional merge and server
step, and narrows it to the output dtype. The writer thread appends the slice to its shard and
hashes it, while the main thread computes the next one; a few slots of buffers go round between
them, so resident memory is those slots (about 10 MB each) whatever the model's size.
"""

from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..errors import UserError
from ..weight_files.dtypes import accumulator_dtype, narrow, widen_into
from ..weight_files.shard_writer import PlannedTensor, ShardWriter
from .job import AverageJob

__all__ = ["CHUNK_ELEMENTS", "TensorStreamer", "WriterThread"]

CHUNK_ELEMENTS = 1 << 20
"""Elements per slice: 4 MB of float32, small enough to stay in the CPU's cache between the passes over it."""
_SLOTS = 3


class _Slot:
    """Buffers of one slice in flight: the sum, and its 16-bit form."""

    def __init__(self) -> None:
        self._acc: dict[str, np.ndarray] = {}
        self.out16 = np.empty(CHUNK_ELEMENTS, dtype=np.uint16)

    def acc(self, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self._acc.get(dtype.str)
        if buf is None or buf.size < n:
            buf = self._acc[dtype.str] = np.empty(max(n, CHUNK_ELEMENTS), dtype=dtype)
        if self.out16.size < n:
            self.out16 = np.empty(n, dtype=np.uint16)
        return buf[:n]


class WriterThread:
    """Appends slices to their shard files in the order given, on one thread; hands each slot back when written."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="supertune-average-writer")
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for _ in range(_SLOTS):
            self._free.put(_Slot())
        self._pending: deque[Future] = deque()

    def __enter__(self) -> WriterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def take(self) -> _Slot:
        """A free slot (waits while every slot is being written)."""
        while True:
            self._raise_if_failed()
            try:
                return self._free.get(timeout=1.0)
            except queue.Empty:
                continue

    def write(self, writer: ShardWriter, values: np.ndarray, slot: _Slot | None = None) -> None:
        self._raise_if_failed()
        self._pending.append(self._pool.submit(self._write, writer, values, slot))

    def finish(self, writer: ShardWriter) -> dict:
        """Wait for every slice of `writer`, flush it; its {"size", "sha256"}."""
        future = self._pool.submit(writer.finish)
        self._pending.append(future)
        self._raise_if_failed(wait=True)
        return future.result()

    def _write(self, writer: ShardWriter, values: np.ndarray, slot: _Slot | None) -> None:
        try:
            writer.write(values)
        finally:
            if slot is not None:
                self._free.put(slot)

    def _raise_if_failed(self, wait: bool = False) -> None:
        while self._pending and (wait or self._pending[0].done()):
            self._pending.popleft().result()


class TensorStreamer:
    """Computes every output tensor of a job, slice by slice, and hands the slices to the writer thread."""

    def __init__(self, job: AverageJob, pipe: WriterThread) -> None:
        self.job = job
        self.pipe = pipe
        self.terms = [(inp.weights, w) for inp, w in zip(job.inputs, job.weights.normalised, strict=True)]
        if job.merge:
            self.terms = [(job.merge.base.weights, 1.0)]
        self._scratch: dict[tuple[str, str], np.ndarray] = {}

    def _buffer(self, role: str, dtype: np.dtype, n: int) -> np.ndarray:
        """Main-thread scratch space, reused from slice to slice."""
        key = (role, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None or buf.size < n:
            buf = self._scratch[key] = np.empty(max(n, CHUNK_ELEMENTS), dtype=dtype)
        return buf[:n]

    def _slices(self, t: PlannedTensor) -> list[tuple[int, int]]:
        step = CHUNK_ELEMENTS
        if self.job.merge and self.job.merge.changes(t.name):
            row = t.shape[-1]
            step = max(1, CHUNK_ELEMENTS // row) * row  # the low-rank sum is computed by whole rows
        return [(s, min(t.numel, s + step)) for s in range(0, t.numel, step)]

    def write_tensor(self, t: PlannedTensor, writer: ShardWriter) -> None:
        for start, stop in self._slices(t):
            if t.name in self.job.averaged:
                slot = self.pipe.take()
                self.pipe.write(writer, self._averaged(t, start, stop, slot), slot)
            else:
                self.pipe.write(writer, self._copied(t.name, start, stop))

    def _copied(self, name: str, start: int, stop: int) -> np.ndarray:
        """A slice of a tensor that is not floating point: equal in every input, copied."""
        files0 = self.terms[0][0]
        first = np.array(files0.rows(name, start, stop))
        files0.release(name, start, stop)
        for i, (files, _) in enumerate(self.terms[1:], start=1):
            if not np.array_equal(first, files.rows(name, start, stop)):
                raise UserError(
                    f"tensor {name} ({files.entry(name).dtype}) is not floating point and differs between {self.job.inputs[0].label(0)} and "
                    f"{self.job.inputs[i].label(i)}; such tensors (counters, indices) are copied, not averaged, and must be equal"
                )
            files.release(name, start, stop)
        return first

    def _averaged(self, t: PlannedTensor, start: int, stop: int, slot: _Slot) -> np.ndarray:
        name, n = t.name, stop - start
        in_dtype = self.job.reference.weights.entry(name).dtype
        acc_type = accumulator_dtype(in_dtype)
        acc, tmp = slot.acc(acc_type, n), self._buffer("tmp", acc_type, n)
        for i, (files, w) in enumerate(self.terms):
            raw = files.rows(name, start, stop)
            x = raw if raw.dtype == acc.dtype else widen_into(raw, in_dtype, tmp)
            if i == 0:
                np.multiply(x, w, out=acc)
            else:
                np.multiply(x, w, out=tmp)
                acc += tmp
            files.release(name, start, stop)
        merge = self.job.merge
        if merge and merge.changes(name):
            row = t.shape[-1]
            merge.add_rows(name, start // row, stop // row, acc, self.job.weights.normalised, tmp)
        # a float sum is finite only if every term is: one pass, and a second only when something is wrong
        if not (np.isfinite(acc.sum()) or np.isfinite(acc).all()):
            raise UserError(self._non_finite(name, start, stop))
        if self.job.server:
            problem = self.job.server.apply(name, start, stop, acc, self._buffer("global", acc_type, n), tmp)
            if problem:
                raise UserError(problem)
        values, finite = narrow(acc, t.dtype, self._buffer("bits", np.dtype(np.uint32), n), slot.out16)
        if not finite:
            raise UserError(
                f"--dtype {self.job.dtype}: tensor {name} has values beyond the range of {t.dtype} after averaging; use --dtype bf16 or fp32"
            )
        return values

    def _non_finite(self, name: str, start: int, stop: int) -> str:
        """Which input holds the NaN or Inf that spoiled the sum (named with the tensor)."""
        job = self.job
        if job.merge:
            sources = [("--base", job.merge.base.weights, name, (start, stop))]
            pairs = job.merge.targets[name].pairs if job.merge.changes(name) else []
            for i, a_name, b_name in pairs:
                files = job.inputs[i].weights
                sources += [(job.inputs[i].label(i), files, n, (0, files.entry(n).numel)) for n in (a_name, b_name)]
        else:
            sources = [(job.inputs[i].label(i), files, name, (start, stop)) for i, (files, _) in enumerate(self.terms)]
        for label, files, tensor, (a, b) in sources:
            entry = files.entry(tensor)
            values = np.empty(b - a, dtype=accumulator_dtype(entry.dtype))
            widen_into(files.rows(tensor, a, b), entry.dtype, values)
            bad = int((~np.isfinite(values)).sum())
            if bad:
                nan = int(np.isnan(values).sum())
                return f"{label}: tensor {tensor} has NaN or Inf values ({nan} NaN, {bad - nan} Inf in the part checked); fix it or leave that input out"
        return f"tensor {name}: the weighted sum overflows to Inf; check the inputs' values and weights"
