"""Checkpoint save time under FSDP: each rank writing its own shards against one gathered full save.

    PYTHONPATH=src .venv/bin/python bench/fsdp_save.py [--nprocs 2 4] [--layers L --hidden H] [--repeats R]

For each process count, torchrun starts that many processes on this machine (gloo); each builds the
same fresh Llama (default 8 layers of 512: about 38 M parameters), shards it with fully_shard (every
decoder layer a unit, then the root, as supertune does) and takes one AdamW step so that the
optimizer holds its moments. Then, side by side in the same processes, `--repeats` times each:

- sharded: what an FSDP checkpoint of supertune writes (supertune.distributed.fsdp_checkpoint):
  every rank its shards of the weights and of the optimizer state, with torch distributed checkpoint;
- gathered: the full weights and the full optimizer state gathered into rank 0's CPU memory
  (get_model_state_dict / get_optimizer_state_dict with full_state_dict and cpu_offload) and written
  there (safetensors, torch.save): what a checkpoint in one file per kind would cost.

Each time is from a barrier before to a barrier after, with the files flushed to disk. Prints the
median of each and their ratio, and writes bench/results/fsdp_save.{json,md}. No test asserts a
time. The gathered save also holds one full copy of the weights and optimizer state (12 bytes a
parameter) in rank 0's memory while it writes; the sharded one never more than a rank's share.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def _sync_dir(path: Path) -> None:
    """Flush every file under `path` to disk (both saves are timed to durable bytes, as checkpoints are)."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from supertune.distributed.fsdp_checkpoint import save_sharded_model, save_sharded_optimizer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=256,
        tie_word_embeddings=False,  # one tensor under two names would need a copy before safetensors
    )
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, config.vocab_size, (2, 128))
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

    root = Path(args.out)
    times: dict[str, list[float]] = {"sharded": [], "gathered": []}
    bytes_written: dict[str, int] = {}
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for i in range(args.repeats):
        for kind in ("sharded", "gathered"):
            target = root / f"{kind}-{i}"
            dist.barrier()
            start = time.perf_counter()
            if kind == "sharded":
                save_sharded_model(model, target)
                save_sharded_optimizer(model, optimizer, target)
            else:
                weights = get_model_state_dict(model, options=full)
                moments = get_optimizer_state_dict(model, optimizer, options=full)
                if rank == 0:
                    target.mkdir(parents=True, exist_ok=True)
                    save_file({k: v.contiguous() for k, v in weights.items()}, target / "model.safetensors")
                    torch.save(moments, target / "optimizer.pt")
            if rank == 0 or kind == "sharded":
                _sync_dir(target)
            dist.barrier()
            times[kind].append(time.perf_counter() - start)
            if rank == 0:
                bytes_written[kind] = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    if rank == 0:
        record = {"processes": world, "parameters": params, "times_s": times, "bytes": bytes_written}
        Path(args.result).write_text(json.dumps(record))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    rows = []
    for n in args.nprocs:
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(n),
                str(Path(__file__).resolve()),
                "--worker",
                "--out",
                str(Path(tmp) / "saves"),
                "--result",
                str(result),
                "--layers",
                str(args.layers),
                "--hidden",
                str(args.hidden),
                "--repeats",
                str(args.repeats),
            ]
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
            subprocess.run(cmd, check=True, env=env, cwd=REPO)
            record = json.loads(result.read_text())
        sharded = statistics.median(record["times_s"]["sharded"])
        gathered = statistics.median(record["times_s"]["gathered"])
        record.update(sharded_median_s=sharded, gathered_median_s=gathered, ratio=gathered / sharded)
        rows.append(record)
        print(
            f"{n} processes: sharded {sharded:.2f} s, gathered {gathered:.2f} s "
            f"(gathered / sharded {gathered / sharded:.2f})"
        )
    import torch

    machine = (
        f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), torch {torch.__version__}, gloo"
    )
    results = BENCH / "results"
    results.mkdir(exist_ok=True)
    (results / "fsdp_save.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=2) + "\n")
    params = rows[0]["parameters"] / 1e6
    lines = [
        "# FSDP checkpoint save: each rank's shards against one gathered save",
        "",
        f"`PYTHONPATH=src .venv/bin/python bench/fsdp_save.py --layers {args.layers} --hidden {args.hidden} "
        f"--repeats {args.repeats}`; {machine}; a fresh Llama of {params:.1f} M parameters, fp32, after one AdamW "
        "step; median of the repeats, each from a barrier to a barrier with every file flushed.",
        "",
        "| processes | sharded (DCP, every rank) | gathered to rank 0 | gathered / sharded | bytes sharded | bytes gathered |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['processes']} | {r['sharded_median_s']:.2f} s | {r['gathered_median_s']:.2f} s | {r['ratio']:.2f} "
            f"| {r['bytes']['sharded'] / 1e6:.0f} MB | {r['bytes']['gathered'] / 1e6:.0f} MB |"
        )
    (results / "fsdp_save.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
