"""The memory arm of the GPU checklist: the largest per-device batch an arm fits at a block size.

Batches of 1, 2, 4, ... are tried, two training steps each (the second step holds what the first
allocated for good: gradients and the optimizer's moments), until one runs out of device memory or
the cap is reached; the largest that ran is the answer. Doubling finds it within a factor of 2 in
log2(answer) + 2 runs, which is what a short GPU loan affords; the next batch up did not fit, so the
figure never claims more than was run.

A run that fails for another reason than memory ends the search with that failure: a batch that
"fit" must have trained, and one that did not must have said it ran out of memory.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checks import Checklist, Row
from .runs import Done, summary

OUT_OF_MEMORY = ("torch.OutOfMemoryError", "CUDA out of memory", "torch.cuda.OutOfMemoryError")
"""What PyTorch writes when an allocation on the device fails (the exception's name, its message)."""


@dataclass(frozen=True)
class Probe:
    """One tried batch."""

    batch: int
    outcome: str
    """"fits", "out of memory" or "failed"."""
    peak_gb: float | None = None
    """Peak device memory of the run, when it trained."""
    note: str = ""
    """Why it failed (exit and log tail)."""


def out_of_memory(log_text: str) -> bool:
    return any(mark in log_text for mark in OUT_OF_MEMORY)


def largest_batch(try_batch: Callable[[int], Probe], most: int) -> tuple[int | None, list[Probe]]:
    """Double the batch from 1 up to `most` while `try_batch` says it fits: (the largest that fit, or
    None when not even 1 did; every probe, in order)."""
    probes: list[Probe] = []
    best, batch = None, 1
    while batch <= most:
        probe = try_batch(batch)
        probes.append(probe)
        if probe.outcome != "fits":
            break
        best, batch = batch, batch * 2
    return best, probes


def describe(probes: list[Probe]) -> str:
    """The probes in one line: "1: 20.1 GB, 2: 35.0 GB, 4: out of memory"."""
    said = [f"{p.batch}: {p.outcome if p.peak_gb is None else f'{p.peak_gb:.1f} GB'}" for p in probes]
    return ", ".join(said)


# --- the check -----------------------------------------------------------------------------------


def check(c: Checklist, block: int) -> None:
    """Rows "memory" for the plain Trainer (defaults + bf16=True) and supertune's training.speed=auto
    at `block` tokens a sequence: the largest per-device batch each fits, and the ratio of the two."""
    z = c.sizes
    if not z.memory_most:
        c.rows.append(Row("memory", f"block {block}", "not run", note="dry run: no device memory to fill on CPU"))
        return
    model = re.sub(r"max_position_embeddings=\d+", f"max_position_embeddings={block}", z.model)
    fits: dict[str, int | None] = {}
    for arm, try_batch in (("plain Trainer defaults + bf16=True", _plain), ("supertune: training.speed=auto", _auto)):
        variant = f"{arm}, block {block}"
        if c._skip("memory", variant, ESTIMATE_S):
            continue
        best, probes = largest_batch(functools.partial(try_batch, c, model, block), z.memory_most)
        fits[arm] = best
        figures: dict[str, object] = {
            "largest batch": best,
            "tokens a step": best * block if best else None,
            "peak GPU memory GB": next((p.peak_gb for p in reversed(probes) if p.outcome == "fits"), None),
            "batches tried": describe(probes),
        }
        plain = fits.get("plain Trainer defaults + bf16=True")
        if arm.startswith("supertune") and best and plain:
            figures["this / plain largest batch"] = best / plain
        failed = next((p for p in probes if p.outcome == "failed"), None)
        note = failed.note if failed else "the cap: a larger batch may fit" if best == z.memory_most else ""
        c.rows.append(Row("memory", variant, "FAILED" if failed or best is None else "ok", figures, note))


ESTIMATE_S = 240
"""What one arm's search at one block took at most, by the doubling's log2(batch) + 2 runs of ~40 s."""


def _plain(c: Checklist, model: str, block: int, batch: int) -> Probe:
    out = c.runner.work / "runs" / f"memory-plain-{block}-{batch}"
    argv = [sys.executable, str(Path(__file__).with_name("plain_trainer.py")), "--out", str(out), "--model", model]
    argv += ["--block", str(block), "--batch", str(batch), "--steps", "2", "--bf16"]
    done = c.runner.run(out.name, argv, cap=300)
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    return _probe(batch, done, result.get("peak_memory_gb"))


def _auto(c: Checklist, model: str, block: int, batch: int) -> Probe:
    settings = {
        "model.config_overrides": model,
        "data.block_size": block,
        "training.per_device_train_batch_size": batch,
        "training.max_steps": 2,
    }
    overrides = [o for o in c._throughput_overrides("sdpa") if o.split("=", 1)[0] not in settings]
    overrides += [f"{k}={v}" for k, v in settings.items()] + ["data.max_eval_samples=4"]
    done, run_dir = c.runner.train(f"memory-auto-{block}-{batch}", overrides, cap=300)
    return _probe(batch, done, summary(run_dir).get("peak_device_memory_gb"))


def _probe(batch: int, done: Done, peak_gb: float | None) -> Probe:
    if done.ok:
        return Probe(batch, "fits", peak_gb)
    log = done.log.read_text(encoding="utf-8", errors="replace") if done.log.exists() else ""
    if out_of_memory(log):
        return Probe(batch, "out of memory")
    return Probe(batch, "failed", note=done.why())
