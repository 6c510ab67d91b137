"""The GPU checklist (../shared/gpu-checklist.md) in one command, for the rare minutes a GPU is lent.

    python3 bench/gpu.py --wheels .whl --out "$OUT"      # on a bare GPU machine, wheels from bench/gpu_wheels.sh
    .venv/bin/python bench/gpu.py --dry-run --out DIR    # on CPU: the same code, the tiny model, a few steps

In order of what is least verified: the embedded default in fp32 and bf16 (which device trained),
FSDP on one GPU (full and shard_grad_op; bf16 and fp16 output reloaded by plain from_pretrained),
a ~1 B Llama at block 2048 in bf16 with supertune's settings beside plain Trainer defaults (tokens/s,
MFU against the GPU's dense bf16 peak, peak memory; supertune with training.speed=plain and with
document masks beside it), the largest batch the plain Trainer and supertune fit at blocks of 4096
and 8192 tokens (doubling until out of memory), SIGKILL-and-resume, DeepSpeed ZeRO-2/3 in bf16
with and without CPU offload, `supertune doctor`, eager (and flash, if installed) attention against
sdpa, and plain Trainer in bf16. Each check fits in what is left of --budget-s or is listed as not
run. Writes gpu-<date>.md and .json to --out (default bench/results), after every check.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_checks import machine, memory, report  # noqa: E402 - bench/ is not a package
from gpu_checks.checks import DRY, GPU, Checklist  # noqa: E402
from gpu_checks.runs import Budget, Runner  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model, few steps: proves the script runs")
    p.add_argument(
        "--wheels", type=Path, help="install these wheels first (a bare GPU machine lacks datasets, deepspeed, ...)"
    )
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results", help="where gpu-<date>.md/.json go"
    )
    p.add_argument("--work", type=Path, help="scratch directory for the runs (default: a new temporary one)")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="CHECK",
        help="run only these checks (names as in the plan: default-fp32, fsdp-full, zero3, ...)",
    )
    p.add_argument("--budget-s", type=float, default=1140, help="seconds for all checks (default 19 minutes)")
    return p.parse_args()


def plan(c: Checklist) -> list[tuple[str, Callable[[], None]]]:
    """The checks in the order they run: what was never verified first, so a short loan covers it."""
    return [
        ("default-fp32", lambda: c.default("fp32")),
        ("default-bf16", lambda: c.default("bf16")),
        ("fsdp-full", lambda: c.fsdp("full", "bf16", bf16=True)),
        ("fsdp-shard_grad_op", lambda: c.fsdp("shard_grad_op", "fp16", bf16=False)),
        ("throughput", lambda: c.throughput_supertune()),
        ("throughput-plain", lambda: c.throughput_supertune("plain")),
        ("throughput-documents", lambda: c.throughput_supertune("auto", documents=True)),
        ("throughput-float8", lambda: c.throughput_supertune("auto", float8=True)),
        ("plain-fp32", lambda: c.throughput_plain(bf16=False)),
        ("zero2", lambda: c.zero(2, "none")),
        ("resume", lambda: c.resume()),
        ("fsdp-resume", lambda: c.resume("fsdp")),
        ("doctor", lambda: c.doctor()),
        ("zero3", lambda: c.zero(3, "none")),
        ("eager", lambda: c.attention("eager")),
        ("flash", lambda: c.attention("flash_attention_2")),
        ("plain-bf16", lambda: c.throughput_plain(bf16=True)),
        ("zero2-offload", lambda: c.zero(2, "cpu")),
        ("zero3-offload", lambda: c.zero(3, "cpu")),
        ("fsdp-offload", lambda: c.fsdp("full", "bf16", True, "cpu_offload", ("distributed.fsdp.cpu_offload=true",))),
        ("fsdp-lora", lambda: c.fsdp("full", "same", True, "LoRA", ("model.lora.enabled=true",))),
        (
            "fsdp-checkpointing",
            lambda: c.fsdp("full", "bf16", True, "gradient checkpointing", ("model.gradient_checkpointing=true",)),
        ),
        # Last: up to 4 x ~240 s of doubling batches; `--only memory-4096 memory-8192` runs them alone.
        ("memory-4096", lambda: memory.check(c, 4096)),
        ("memory-8192", lambda: memory.check(c, 8192)),
    ]


# The dry run's default: one variant of each check, so every code path runs in a fraction of the time.
# throughput-plain and throughput-documents are left out: each is one more run of the throughput
# check's code with one setting changed (training.speed, data.document_mask), and the document
# masks' own path, flex attention taken on CUDA only, is trained on CPU by tests/test_flex_documents.py.
# throughput-float8 is left out as well: the dry run trains on CPU, where training.float8 is refused
# before the run starts (no float8 matmuls), and tests/test_float8.py checks that refusal and the wiring.
# The memory checks are left out too: the dry run's sizes leave them nothing to fill (Sizes.memory_most).
DRY_RUN_CHECKS = (
    "default-fp32",
    "fsdp-full",
    "throughput",
    "plain-fp32",
    "zero3",
    "resume",
    "doctor",
    "eager",
    "flash",
)


def refuse_unknown(only: list[str]) -> None:
    """--only names that are no check: one line before anything runs or is written."""
    names = [name for name, _ in plan(Checklist.__new__(Checklist))]  # the names only: no check is called
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise SystemExit(
            f"bench/gpu.py: error: --only: no check named {', '.join(unknown)}; the checks: {', '.join(names)}"
        )


def main() -> int:
    a = parse()
    if a.only:
        # Before the wheels, the probe of the machine (a child importing torch) and the first report.
        refuse_unknown(a.only)
    started = time.time()
    work = a.work or Path(tempfile.mkdtemp(prefix="supertune-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    installed = machine.install_wheels(a.wheels, work / "site") if a.wheels else "none carried"
    env = machine.child_environment(work / "site" if a.wheels else None, work, a.dry_run)
    facts = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "wheels": installed,
        **machine.describe(env),
    }
    sizes = DRY if a.dry_run else GPU
    settings = {"mode": "dry run (CPU, tiny model)" if a.dry_run else "GPU", "budget s": a.budget_s, **vars(sizes)}
    stem = "gpu-dry-run" if a.dry_run else f"gpu-{dt.date.today().isoformat()}"
    title = "GPU checklist" + (" (dry run)" if a.dry_run else f": {facts.get('gpu') or 'no GPU seen'}")
    checklist = Checklist(Runner(work, env, Budget(a.budget_s)), sizes, a.dry_run)
    path = report.write(a.out, stem, title, facts, settings, [])
    checks = plan(checklist)
    only = a.only or (DRY_RUN_CHECKS if a.dry_run else None)
    for name, check in checks:
        if only and name not in only:
            continue
        check()
        facts["elapsed s"] = round(time.time() - started)
        path = report.write(a.out, stem, title, facts, settings, checklist.rows)
        last = checklist.rows[-1] if checklist.rows else None
        if last:
            print(f"{time.time() - started:6.0f} s  {last.check} [{last.variant}]: {last.status}", flush=True)
    print(f"report: {path} (runs and logs under {work})")
    failed = [r for r in checklist.rows if r.status in ("FAILED", "differs")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
