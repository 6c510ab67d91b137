"""Peak memory per training process: FSDP (with and without cpu_offload) against DDP, at 2 and 4 processes.

    .venv/bin/python bench/fsdp_memory.py [--steps N] [--nprocs 2 4] [--layers L --hidden H] [--mmap-threshold BYTES]

Each run is `supertune train --nproc N` on the embedded corpus with a wider, deeper fresh Llama
(model.config_overrides; default 8 layers of 512 with 8 heads: about 26 M parameters; 22 M in the
committed results, measured while an override of hidden_size left head_dim at the tiny default's
32), so weights, gradients and
AdamW state, 16 bytes a parameter under DDP, stand out of the ~0.5 GB every torch process costs).
While it runs, each training process's peak resident set (VmHWM in /proc/<pid>/status, the kernel's
own high-water mark, so polling misses nothing) is read until it exits. Prints per process count
the largest and mean peak RSS of each strategy and its ratio to DDP's, and writes
bench/results/fsdp_memory.{json,md}. On CPU, cpu_offload keeps the same bytes in the same memory:
it changes where the optimizer step runs, not the total; on GPUs it moves the shards off the GPU.

glibc keeps freed blocks below its (self-raising) mmap threshold in the heap, so the per-layer
all-gather and reduce-scatter buffers FSDP frees on CPU stay resident and hide most of the saving.
`--mmap-threshold 65536` sets MALLOC_MMAP_THRESHOLD_ in the training processes (large blocks are
then mapped and returned on free) and writes bench/results/fsdp_memory_mmap.{json,md} instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

VARIANTS = {
    "ddp": [],
    "fsdp full": ["distributed.strategy=fsdp"],
    "fsdp full + cpu_offload": ["distributed.strategy=fsdp", "distributed.fsdp.cpu_offload=true"],
}


def _workers(root: int) -> list[int]:
    """Descendant processes of `root` running a training process."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                if b"supertune.train.lifecycle.worker" in (Path("/proc") / str(child) / "cmdline").read_bytes():
                    found.append(child)
            except OSError:
                pass
    return found


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(nproc: int, extra: list[str], steps: int, layers: int, hidden: int, mmap_threshold: int | None) -> list[float]:
    """Peak RSS (MB) of each training process of one run."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "supertune",
            "train",
            "--run-dir",
            f"{tmp}/run",
            "--nproc",
            str(nproc),
            f"training.max_steps={steps}",
            "training.save_strategy=no",
            "training.report_to=[]",
            "training.global_batch_size=16",
            "training.per_device_train_batch_size=8",
            "generate.max_new_tokens=0",
            "output.save_model=false",
            f"model.config_overrides=num_hidden_layers={layers},hidden_size={hidden},intermediate_size={hidden * 11 // 4},"
            f"num_attention_heads={hidden // 64},num_key_value_heads={hidden // 64}",
            *extra,
        ]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        peaks: dict[int, float] = {}
        while proc.poll() is None:
            for pid in _workers(proc.pid):
                mb = _hwm_mb(pid)
                if mb is not None:
                    peaks[pid] = max(peaks.get(pid, 0.0), mb)
            time.sleep(0.1)
        out = proc.stdout.read() if proc.stdout else ""
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(extra) or 'ddp'} at {nproc} processes failed:\n{out[-3000:]}")
    return sorted(peaks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument(
        "--mmap-threshold", type=int, default=None, help="MALLOC_MMAP_THRESHOLD_ for the training processes"
    )
    a = parser.parse_args()
    rows = []
    for nproc in a.nprocs:
        base = None
        for name, extra in VARIANTS.items():
            peaks = run(nproc, extra, a.steps, a.layers, a.hidden, a.mmap_threshold)
            mean = sum(peaks) / len(peaks)
            base = base if base is not None else mean
            row = {
                "processes": nproc,
                "run": name,
                "peak_rss_mb_max": round(max(peaks), 1),
                "peak_rss_mb_mean": round(mean, 1),
                "ratio_to_ddp": round(mean / base, 3),
                "processes_seen": len(peaks),
            }
            rows.append(row)
            print(
                f"{nproc} processes  {name:<24} peak RSS max {row['peak_rss_mb_max']:8.1f} MB  mean {row['peak_rss_mb_mean']:8.1f} MB  "
                f"x{row['ratio_to_ddp']:.3f} of ddp",
                flush=True,
            )
    results = BENCH / "results"
    results.mkdir(exist_ok=True)
    meta = {
        "steps": a.steps,
        "layers": a.layers,
        "hidden": a.hidden,
        "global_batch": 16,
        "device": "cpu",
        "MALLOC_MMAP_THRESHOLD_": a.mmap_threshold,
    }
    stem = "fsdp_memory" if a.mmap_threshold is None else "fsdp_memory_mmap"
    (results / f"{stem}.json").write_text(json.dumps({"settings": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "| processes | run | peak RSS per process, max (MB) | mean (MB) | mean vs ddp |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['processes']} | {r['run']} | {r['peak_rss_mb_max']} | {r['peak_rss_mb_mean']} | {r['ratio_to_ddp']} |"
        for r in rows
    ]
    (results / f"{stem}.md").write_text(f"settings: {json.dumps(meta)}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
