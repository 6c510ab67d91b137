"""The communication pre-flight: how fast all_reduce and all_gather really are between the processes
of this job, before training pays for them.

Each collective runs on float32 buffers whose size doubles from --min-size to --max-size: first
--warmup untimed runs, then --repeats timed runs, each started right after a 1-element all_reduce
that lines the processes up. A run's time is that of the slowest process (a MAX all_reduce of the
per-process times afterwards, so it costs nothing while timing); the report gives the median.

Bandwidths, as nccl-tests define them (NVIDIA/nccl-tests, doc/PERFORMANCE.md), with S the size in
bytes, t the time and n the number of processes; GB/s means 1e9 bytes per second:
  algbw = S / t
  busbw = algbw * 2(n-1)/n   for all_reduce (each byte crosses 2(n-1) links out of n)
  busbw = algbw * (n-1)/n    for all_gather (S is the gathered result: each process sends S/n)
busbw is comparable to a link's peak whatever n is, which makes it the number to set
--expect-gbps against. nccl-tests report the mean time over ranks and iterations; this takes
the slowest process and the median of the runs, which is steadier on shared nodes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from ..launch.environment import LaunchEnvironment
from .options import DoctorOptions, size_label
from .result import CheckResult, fail, ok

__all__ = ["OPS", "bus_factor", "bandwidths", "message_sizes", "Measurement", "CommResult", "comm_check", "CommSession"]

OPS = ("all_reduce", "all_gather")
_ELEMENT = 4  # float32


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw of a collective over n processes (nccl-tests' correction factors)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(op: str, size_bytes: int, time_s: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s)."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(op, n)


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes doubling from min_bytes while they do not exceed max_bytes."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


@dataclass(frozen=True)
class Measurement:
    """One collective at one size."""

    op: str
    size_bytes: int
    """Bytes of the buffer (all_reduce) or of the gathered result (all_gather), as nccl-tests count."""
    time_s: float
    """Median over the timed runs of the slowest process's time."""
    times_s: tuple[float, ...]
    algbw_gbps: float
    busbw_gbps: float


@dataclass
class CommResult:
    """The measurements of a pre-flight, or why there are none."""

    backend: str
    device: str
    world_size: int
    num_nodes: int
    warmup: int
    repeats: int
    expect_gbps: float | None = None
    measurements: list[Measurement] = field(default_factory=list)
    error: str | None = None

    def headline(self) -> dict[str, Measurement]:
        """Each collective's measurement at its largest size."""
        best: dict[str, Measurement] = {}
        for m in self.measurements:
            if m.op not in best or m.size_bytes > best[m.op].size_bytes:
                best[m.op] = m
        return best

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bus_factors"] = {op: bus_factor(op, self.world_size) for op in OPS} if self.world_size > 1 else {}
        data["headline_busbw_gbps"] = {op: m.busbw_gbps for op, m in self.headline().items()}
        return data


def comm_check(result: CommResult) -> CheckResult:
    """The verdict on a pre-flight: it ran, and both collectives reached --expect-gbps at the largest size."""
    name = "comm"
    where = f"{result.world_size} processes on {result.num_nodes} node(s), {result.backend} on {result.device}"
    if result.error:
        return fail(
            name,
            f"{where}: {result.error}",
            "see the nccl-socket-ifname, gloo-socket-ifname, fabric and rendezvous checks; NCCL_DEBUG=INFO "
            "(and TORCH_DISTRIBUTED_DEBUG=DETAIL) show where it stopped",
        )
    heads = result.headline()
    summary = ", ".join(f"{op} {m.busbw_gbps:.3g} GB/s" for op, m in heads.items())
    size = size_label(max(m.size_bytes for m in heads.values())) if heads else "-"
    evidence = f"{where}: bus bandwidth at {size}: {summary}"
    if result.expect_gbps is not None:
        slow = [f"{op} {m.busbw_gbps:.3g} GB/s" for op, m in heads.items() if m.busbw_gbps < result.expect_gbps]
        if slow:
            return fail(
                name,
                f"{evidence}; below --expect-gbps {result.expect_gbps:g}: {', '.join(slow)}",
                "the interconnect is slower than expected: check the fabric and *-socket-ifname checks (a wrong interface, "
                "InfiniBand disabled or a missing network plugin send NCCL over TCP; NCCL_DEBUG=INFO names the transport, "
                "NET/IB or NET/Socket); if this is what the network gives, lower --expect-gbps",
            )
        evidence += f" (at least --expect-gbps {result.expect_gbps:g})"
    return ok(name, evidence)


class CommSession:
    """The process group of a pre-flight: formed with a time limit, used to agree, measure and
    gather, then destroyed. Control messages (flags, times, reports) go over gloo on the CPU; the
    measured collectives over the measured backend."""

    def __init__(self, view: LaunchEnvironment, options: DoctorOptions):
        self.view, self.options = view, options
        self.formed = False
        self.backend = "gloo"
        self.device = "cpu"

    def form(self) -> str | None:
        """Create the process group; the error text when it could not be formed in time."""
        import torch
        import torch.distributed as dist

        from ..distributed.process_group import join_restarted_group

        wanted = self.options.backend
        if wanted == "auto":
            wanted = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"
        self.backend = wanted
        try:
            if wanted == "nccl":
                if self.view.device_index >= torch.cuda.device_count():
                    return f"local rank {self.view.local_rank} has no GPU of its own (torch sees {torch.cuda.device_count()}): start one process per GPU"
                torch.cuda.set_device(self.view.device_index)
                self.device = f"cuda:{self.view.device_index}"
            timeout = timedelta(seconds=self.options.timeout_s)
            join_restarted_group(self.view, int(self.options.timeout_s))
            if not dist.is_initialized():
                dist.init_process_group(backend="cpu:gloo,cuda:nccl" if wanted == "nccl" else "gloo", timeout=timeout)
        except Exception as exc:  # torch raises RuntimeError, DistStoreError, ValueError, ... here
            return f"the process group did not form within {self.options.timeout_s:g} s: {_one_line(exc)}"
        self.formed = True
        return None

    def any_true(self, flag: bool) -> bool:
        """Whether any process passed True."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def max_int(self, value: int) -> int:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        found: list[Any] = [None] * self.view.world_size
        dist.all_gather_object(found, obj)
        return found

    def result(self, error: str | None = None) -> CommResult:
        """This session's result before any measurement; with `error`, why there will be none."""
        o = self.options
        return CommResult(
            self.backend,
            self.device,
            self.view.world_size,
            self.view.num_nodes,
            o.warmup,
            o.repeats,
            o.expect_gbps,
            error=error,
        )

    def measure(self) -> CommResult:
        """Every collective at every size; an exception becomes the result's error."""
        o = self.options
        result = self.result()
        op, size = OPS[0], o.min_size
        try:
            for op in OPS:
                for size in message_sizes(o.min_size, o.max_size):
                    result.measurements.append(self._measure_one(op, size))
        except Exception as exc:
            result.error = f"{op} of {size_label(size)} failed: {_one_line(exc)}"
        return result

    def _measure_one(self, op: str, size: int) -> Measurement:
        import statistics

        import torch
        import torch.distributed as dist

        n, device, cuda = self.view.world_size, torch.device(self.device), self.device.startswith("cuda")
        if op == "all_reduce":
            count = max(1, size // _ELEMENT)
            buffer = torch.ones(count, dtype=torch.float32, device=device)
            size = count * _ELEMENT

            def run() -> None:
                dist.all_reduce(buffer)
        else:
            per_rank = max(1, size // (_ELEMENT * n))
            source = torch.ones(per_rank, dtype=torch.float32, device=device)
            gathered = torch.empty(per_rank * n, dtype=torch.float32, device=device)
            size = per_rank * n * _ELEMENT
            # all_gather_single is torch 2.13's name for all_gather_into_tensor.
            gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

            def run() -> None:
                gather_into(gathered, source)

        line_up = torch.zeros(1, dtype=torch.float32, device=device)
        times = []
        for i in range(self.options.warmup + self.options.repeats):
            dist.all_reduce(line_up)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            if i >= self.options.warmup:
                times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        per_run = tuple(float(t) for t in slowest)
        median = statistics.median(per_run)
        algbw, busbw = bandwidths(op, size, median, n)
        return Measurement(op, size, median, per_run, algbw, busbw)

    def close(self) -> None:
        import torch.distributed as dist

        if self.formed and dist.is_initialized():
            dist.destroy_process_group()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"
