"""The options of `supertune doctor` and of its worker, parsed once for both (no torch here)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..byte_sizes import parse_byte_size
from ..errors import UserError

__all__ = [
    "DoctorOptions",
    "add_doctor_arguments",
    "options_from_args",
    "parse_size",
    "format_size",
    "size_label",
    "preflight_arguments",
]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class DoctorOptions:
    """What a doctor run does; defaults are those of `supertune doctor` without options."""

    json: bool = False
    """Print one JSON object instead of the text report."""
    comm: bool = False
    """Measure all_reduce and all_gather between the processes of the job (needs 2 or more)."""
    nproc: int | None = None
    """Start this many local processes through torchrun for --comm."""
    expect_gbps: float | None = None
    """Least bus bandwidth, in GB/s (1e9 bytes per second), at the largest size, of both collectives."""
    min_size: int = 1 << 20
    max_size: int = 1 << 30
    warmup: int = 2
    repeats: int = 5
    backend: str = "auto"
    """auto (nccl when torch sees a GPU, else gloo), gloo or nccl."""
    timeout_s: float = 300.0
    """Limit for forming the process group and for each collective."""
    out: str | None = None
    """Also write the JSON report to this file (by rank 0)."""
    dirs: tuple[str, ...] = ()
    """More directories to check for writability and free space."""
    min_free_gb: float = 20.0
    """Warn when a checked file system has less free space (GiB)."""
    exit_zero: bool = False
    """Exit 0 after a complete report even when a check failed (the --nproc parent reads --out instead)."""

    def worker_argv(self, out: str | None = None, exit_zero: bool = False) -> list[str]:
        """The worker's command-line arguments that reproduce these options (--nproc excluded)."""
        args = ["--comm"] if self.comm else []
        if self.json:
            args.append("--json")
        if self.expect_gbps is not None:
            args += ["--expect-gbps", repr(self.expect_gbps)]
        args += ["--min-size", format_size(self.min_size), "--max-size", format_size(self.max_size)]
        args += ["--warmup", str(self.warmup), "--repeats", str(self.repeats), "--backend", self.backend]
        args += ["--timeout", repr(self.timeout_s), "--min-free-gb", repr(self.min_free_gb)]
        for d in self.dirs:
            args += ["--dir", d]
        if out or self.out:
            args += ["--out", out or self.out or ""]
        if exit_zero or self.exit_zero:
            args.append("--exit-zero")
        return args


def preflight_arguments(
    expect_gbps: float | None = None, report: str | None = None, max_size: str | None = None
) -> list[str]:
    """The words after the doctor's worker entry point in a job's pre-flight step (pure, for
    job-script rendering): node checks and the bandwidth measurement, the JSON report to `report`."""
    args = ["--comm"]
    if expect_gbps is not None:
        args += ["--expect-gbps", f"{expect_gbps:g}"]
    if max_size is not None:
        args += ["--max-size", max_size]
    if report is not None:
        args += ["--out", report]
    return args


def add_doctor_arguments(p: argparse.ArgumentParser, with_nproc: bool = True) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object (every check, and the measurements with --comm) instead of the text report",
    )
    p.add_argument(
        "--comm",
        action="store_true",
        help="also form the process group and measure all_reduce and all_gather bandwidth between the processes (under torchrun or srun, or with --nproc)",
    )
    if with_nproc:
        p.add_argument(
            "--nproc",
            type=int,
            help="with --comm: start N processes on this machine through torchrun (gloo on CPU, nccl on GPUs)",
        )
    p.add_argument(
        "--expect-gbps",
        type=float,
        metavar="X",
        help="with --comm: exit non-zero when the bus bandwidth of all_reduce or all_gather at the largest size is below X GB/s "
        "(1e9 bytes/s, the unit of nccl-tests; a 200 Gb/s link is 25 GB/s)",
    )
    p.add_argument(
        "--min-size",
        default="1M",
        help="smallest message of --comm, bytes with K/M/G (binary) suffix (default: %(default)s)",
    )
    p.add_argument(
        "--max-size",
        default="1G",
        help="largest message of --comm (default: %(default)s); sizes double from --min-size",
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed runs of each collective and size first (default: %(default)s)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed runs of each collective and size; the median is reported (default: %(default)s)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl (RCCL on ROCm) when torch sees a GPU, else gloo (default)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="limit for forming the process group and for each collective (default: %(default)s)",
    )
    p.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument(
        "--dir",
        action="append",
        default=[],
        dest="dirs",
        metavar="DIR",
        help="also check that DIR is writable and has room (repeatable)",
    )
    p.add_argument(
        "--min-free-gb",
        type=float,
        default=20.0,
        help="warn when a checked file system has less free space, in GiB (default: %(default)s)",
    )
    p.add_argument("--exit-zero", action="store_true", help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    """Checked options; every problem is a UserError naming the option and the fix."""
    problems = []
    nproc = getattr(args, "nproc", None)
    sizes = {}
    for option, value in (("--min-size", args.min_size), ("--max-size", args.max_size)):
        try:
            sizes[option] = parse_size(value)
        except ValueError as exc:
            problems.append(f"{option}: {exc}")
    if nproc is not None and nproc < 2:
        problems.append(f"--nproc: needs 2 or more processes to measure between, got {nproc}")
    if nproc is not None and not args.comm:
        problems.append("--nproc: only with --comm (the node checks need one process)")
    if args.expect_gbps is not None and not args.comm:
        problems.append("--expect-gbps: only with --comm, which measures the bandwidth")
    # argparse's float() takes nan and inf, which every comparison below would let through.
    if args.expect_gbps is not None and not (math.isfinite(args.expect_gbps) and args.expect_gbps > 0):
        problems.append(f"--expect-gbps: must be a positive number of GB/s, e.g. 20, got {args.expect_gbps}")
    if args.repeats < 1 or args.warmup < 0:
        problems.append(
            f"--repeats/--warmup: need at least 1 timed run and no negative warm-up, got {args.repeats}/{args.warmup}"
        )
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        problems.append(f"--timeout: must be a positive number of seconds, got {args.timeout}")
    if not (math.isfinite(args.min_free_gb) and args.min_free_gb >= 0):
        problems.append(f"--min-free-gb: must be a number of GiB, 0 or more, got {args.min_free_gb}")
    if len(sizes) == 2 and not 4 <= sizes["--min-size"] <= sizes["--max-size"]:
        problems.append(f"--min-size/--max-size: need 4 B <= min <= max, got {args.min_size} and {args.max_size}")
    if problems:
        raise UserError("; ".join(problems))
    return DoctorOptions(
        json=args.json,
        comm=args.comm,
        nproc=nproc,
        expect_gbps=args.expect_gbps,
        min_size=sizes["--min-size"],
        max_size=sizes["--max-size"],
        warmup=args.warmup,
        repeats=args.repeats,
        backend=args.backend,
        timeout_s=args.timeout,
        out=args.out,
        dirs=tuple(args.dirs),
        min_free_gb=args.min_free_gb,
        exit_zero=args.exit_zero,
    )


def parse_size(text: str) -> int:
    """Bytes from "4096", "64K", "1M", "1G" (binary multiples, as nccl-tests read -b/-e; see supertune.byte_sizes)."""
    return parse_byte_size(text)


def format_size(n: int) -> str:
    """The shortest exact spelling of a size: 1G, 64M, 4K, 1000."""
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def size_label(n: int) -> str:
    """A size for people: "1 MiB", "64 KiB", "1000 B"."""
    short = format_size(n)
    return f"{short[:-1]} {short[-1]}iB" if short[-1] in "KMG" else f"{short} B"
