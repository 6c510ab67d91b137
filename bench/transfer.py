"""Bytes a site sends each round, and where the federation ends, with and without compressed changes.

    PYTHONPATH=src .venv/bin/python bench/transfer.py [--rounds 3] [--steps 20] [--arms model-fp32 ...]
        [--seeds 42 1 2 ...]

One federation of the embedded default (two sites, each on its own corpus, as `supertune federate`
runs with no config) per arm, side by side in one run; the arms differ only in `transfer:`:

- model-fp32: each site sends its model as trained (no transfer settings: the checkpoint's weights);
- delta-bf16, delta-int8, delta-int4: the change from the round's global model, in bf16 or
  blockwise int8 or int4 (block 64), with error feedback.

- secure-int8 (`--secure-sites 2 3 4`, run in this process, no federation): one round of secure
  aggregation (supertune.transfer.secure_sum and secure_masks, docs/federated/privacy.md) over the
  embedded model's tensors for 2, 3 and 4 sites, the bytes of one site's masked upload (both of its
  exchanges, packed) against its unmasked int8 package (values and float32 scales), and the decoded
  average's distance from the plain average of the changes. The changes are Gaussian (std 1e-3, each
  site's std drawn from 0.8 to 1.25 of it): the bytes do not depend on the values, the error in
  units of the step little. `--secure-only` runs this arm alone and keeps the federation arms' rows
  of the last run in bench/results/transfer.{json,md}.

The bytes are compared with delta-bf16's, which are a bf16 model's but for a few bytes of header (2
bytes a value, the same tensors): a site sending its model in bf16 sends as many.

For each arm it reads the rounds' `averaged.json` (the weight bytes each site sent, as the round
table shows them) and `rounds.json` (the last round's global eval loss on every site), prints a
table with each arm's bytes as a fraction of a bf16 model's and its mean final loss against
model-fp32's, and writes bench/results/transfer.{json,md}. No test asserts any of it.

With several `--seeds` every arm runs once per seed (`training.seed` of both sites: the order their
data is drawn in, each round), and each arm's loss is compared with model-fp32's of the same seed:
the final loss of 3 rounds of 20 steps of this tiny model moves by about 2 % with any change of its
trajectory (a seed, or the rounding of what a round sent), so one seed cannot tell a 1 % effect.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
ARMS = {
    "model-fp32": {},
    "delta-bf16": {"delta": True, "dtype": "bf16"},
    "delta-int8": {"delta": True, "dtype": "int8", "block_size": 64},
    "delta-int4": {"delta": True, "dtype": "int4", "block_size": 64},
}


def _federation(root: Path, transfer: dict, rounds: int, steps: int, seed: int | None = None) -> Path:
    sys.path.insert(0, str(REPO / "src"))
    from supertune.federation.config.default import site_corpus

    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        sites.append({
            "name": name,
            "overrides": [f"data.train_files={train}", f"data.validation_files={validation}",
                          "generate.max_new_tokens=0", "training.report_to=[]", "training.warmup_steps=0.1",
                          *([f"training.seed={seed}"] if seed is not None else [])],
            "steps_per_round": steps,
        })  # fmt: skip
    config = {
        "name": "transfer-bench",
        "rounds": rounds,
        "sites": sites,
        **({"transfer": transfer} if transfer else {}),
    }
    path = root / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _arm(name: str, transfer: dict, work: Path, rounds: int, steps: int, seed: int | None = None) -> dict:
    root = work / (name if seed is None else f"{name}-seed{seed}")
    root.mkdir()
    config = _federation(root, transfer, rounds, steps, seed)
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(config), "--dir", str(root / "fed")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name}: federate failed:\n{proc.stderr[-3000:]}")
    fed = root / "fed"
    sent = []
    for number in range(1, rounds + 1):
        averaged = json.loads((fed / f"round-{number:03d}" / "averaged.json").read_text())
        sent.append(averaged["sent_bytes"])
    table = json.loads((fed / "rounds.json").read_text())
    last = {r["site"]: r["global"] for r in table["rows"] if r["round"] == rounds}
    per_round = [sum(b.values()) / len(b) for b in sent]
    return {
        "arm": name,
        "seed": seed,
        "transfer": transfer,
        "bytes_per_site_round": sum(per_round) / len(per_round),
        "sent_bytes": sent,
        "final_global_loss": last,
        "final_mean_loss": sum(last.values()) / len(last),
        "seconds": round(time.time() - started, 1),
    }


def _embedded_tensor_sizes() -> list[int]:
    """The number of values of each tensor of the embedded tiny Llama, built on the meta device."""
    sys.path.insert(0, str(REPO / "src"))
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from supertune.embedded.model import default_model_config
    from supertune.embedded.tokenizer import default_tokenizer

    tok = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    config = LlamaConfig(**default_model_config(len(tok), 0, 0, 0))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return [p.numel() for _, p in model.named_parameters()]  # a tied tensor once, as the checkpoint keeps it


def _secure_arm(sites: int, sizes: list[int], seed: int = 0) -> dict:
    """One secure round of `sites` sites over tensors of `sizes` values: bytes and error."""
    import numpy as np

    from supertune.transfer.codec import Codec
    from supertune.transfer.secure_masks import MaskContext, PairMasks, public_key_text, read_public_key
    from supertune.transfer.secure_sum import SecureSum, pack_bits, unpack_bits

    rng = np.random.default_rng(seed)
    plan, codec = SecureSum("int8", sites), Codec("int8")
    names = [f"site{i}" for i in range(sites)]
    keys = {n: rng.bytes(32) for n in names}
    peers = {n: read_public_key(public_key_text(k)) for n, k in keys.items()}
    masks = {n: PairMasks(n, keys[n], peers, MaskContext("bench", 1, 1)) for n in names}
    stds = 1e-3 * rng.uniform(0.8, 1.25, sites)
    weights = rng.uniform(1.0, 2.0, sites)
    fractions = weights / weights.sum()
    masked = unmasked = clipped = 0
    steps, plain_errors = [], []
    errors = []
    for t, numel in enumerate(sizes):
        changes = [rng.normal(0, s, numel).astype(np.float32) for s in stds]
        field_sum = np.zeros(plan.blocks(numel), np.uint32)
        for n, x in zip(names, changes, strict=True):
            upload = pack_bits(masks[n].apply(plan.scale_field(x), f"scales:{t}", 0, plan.scale_bits), plan.scale_bits)
            field_sum = plan.add(field_sum, unpack_bits(upload, plan.scale_bits, field_sum.size), plan.scale_bits)
            masked += upload.nbytes if n == names[0] else 0
        scales = plan.shared_scales(field_sum)
        total = np.zeros(numel, np.uint32)
        for n, x, p in zip(names, changes, fractions, strict=True):
            q, c = plan.encode(x, scales, float(p))
            clipped += c
            upload = pack_bits(masks[n].apply(q, f"values:{t}", 0, plan.sum_bits), plan.sum_bits)
            total = plan.add(total, unpack_bits(upload, plan.sum_bits, numel), plan.sum_bits)
            if n == names[0]:
                masked += upload.nbytes
                stored, _ = codec.encode(x, "F32")
                unmasked += stored.nbytes + 4 * codec.blocks(numel)
        plain = sum(p * x.astype(np.float64) for p, x in zip(fractions, changes, strict=True))
        step = np.repeat(scales.astype(np.float64), plan.block_size)[:numel]
        errors.append(np.abs(plan.decode(total, scales) - plain) / step)
        steps.append(step)
        # the plain int8 federation: each site's own blockwise int8, then the weighted average
        decoded = sum(p * codec.encode(x, "F32")[1].astype(np.float64) for p, x in zip(fractions, changes, strict=True))
        plain_errors.append(np.abs(decoded - plain))
    error, step = np.concatenate(errors), np.concatenate(steps)
    plain_error = np.concatenate(plain_errors)
    return {
        "sites": sites,
        "values": sum(sizes),
        "masked_bytes_per_site": masked,
        "unmasked_int8_bytes_per_site": unmasked,
        "ratio": masked / unmasked,
        "bound": plan.sum_bits / plan.value_bits,
        "clipped_values": clipped,
        "max_error_in_steps": float(error.max()),
        "mean_error_in_steps": float(error.mean()),
        "rms_error_vs_plain_int8": float(np.sqrt(np.mean((error * step) ** 2)) / np.sqrt(np.mean(plain_error**2))),
    }


def _secure_lines(rows: list[dict], command: str) -> list[str]:
    lines = [
        "## Secure aggregation: one site's masked int8 upload",
        "",
        f"`{command.strip()}`: one secure round over the embedded model's tensors ({rows[0]['values']:,} values), "
        "Gaussian changes (std 1e-3 x 0.8 to 1.25 per site, token weights 1 to 2), in this process. Bytes: one site's "
        "two masked exchanges, packed, against its unmasked int8 package (values and float32 scales, block 64). "
        "Error: the decoded average against the plain weighted average of the changes, in shared steps s; "
        "vs plain int8: its RMS against the RMS error of the plain int8 federation's average (each site's own scales).",
        "",
        "| sites | masked bytes | unmasked int8 bytes | ratio | bound (b + ceil(log2 N)) / b | clipped values "
        "| max error (steps) | mean error (steps) | RMS error vs plain int8 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['sites']} | {r['masked_bytes_per_site']:,} | {r['unmasked_int8_bytes_per_site']:,} | {r['ratio']:.4f} | "
            f"{r['bound']:.3f} | {r['clipped_values']} | {r['max_error_in_steps']:.3f} | {r['mean_error_in_steps']:.3f} | "
            f"{r['rms_error_vs_plain_int8']:.2f}x |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps per round at each site")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="training.seed of the sites, one federation per arm and seed (default: the config's, 42)")  # fmt: skip
    parser.add_argument("--secure-sites", nargs="+", type=int, default=[2, 3, 4],
                        help="the secure-int8 arm's numbers of sites (each one secure round, in this process)")  # fmt: skip
    parser.add_argument("--secure-only", action="store_true",
                        help="run only the secure-int8 arm; the federation arms' rows of the last run are kept")  # fmt: skip
    args = parser.parse_args()
    command = "PYTHONPATH=src .venv/bin/python bench/transfer.py " + " ".join(sys.argv[1:])
    sizes = _embedded_tensor_sizes()
    secure = [_secure_arm(n, sizes) for n in args.secure_sites]
    results = BENCH / "results"
    if args.secure_only:
        kept = json.loads((results / "transfer.json").read_text())
        kept["secure_aggregation"] = {"command": command, "rows": secure}
        text = (results / "transfer.md").read_text().split("\n## Secure aggregation")[0].rstrip("\n")
        text += "\n\n" + "\n".join(_secure_lines(secure, command)) + "\n"
        print(text)
        (results / "transfer.json").write_text(json.dumps(kept, indent=2) + "\n")
        (results / "transfer.md").write_text(text)
        return
    seeds = args.seeds or [None]
    with tempfile.TemporaryDirectory(prefix="supertune-transfer-bench-") as tmp:
        runs = [
            _arm(name, ARMS[name], Path(tmp), args.rounds, args.steps, seed) for seed in seeds for name in args.arms
        ]
    fp32 = {r["seed"]: r["final_mean_loss"] for r in runs if r["arm"] == "model-fp32"}
    for r in runs:
        r["loss_vs_fp32_model"] = r["final_mean_loss"] / fp32[r["seed"]] if r["seed"] in fp32 else None
    rows = []
    for name in args.arms:
        mine = [r for r in runs if r["arm"] == name]
        gaps = [r["loss_vs_fp32_model"] - 1 for r in mine if r["loss_vs_fp32_model"] is not None]
        rows.append({
            "arm": name,
            "transfer": ARMS[name],
            "bytes_per_site_round": sum(r["bytes_per_site_round"] for r in mine) / len(mine),
            "final_mean_loss": sum(r["final_mean_loss"] for r in mine) / len(mine),
            "loss_vs_fp32_model": 1 + sum(gaps) / len(gaps) if gaps else None,
            "gap_range": [min(gaps), max(gaps)] if gaps else None,
            "seconds": sum(r["seconds"] for r in mine),
            "runs": mine,
        })  # fmt: skip
    bf16 = next((r["bytes_per_site_round"] for r in rows if r["arm"] == "delta-bf16"), None)
    for r in rows:
        r["bytes_vs_bf16_model"] = r["bytes_per_site_round"] / bf16 if bf16 else None
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": __import__("os").cpu_count()}
    said = "the sites' configured seed" if seeds == [None] else f"training.seed {', '.join(map(str, seeds))}"
    lines = [
        "# What a site sends per round",
        "",
        f"`{command.strip()}`: the embedded federation (2 sites, {args.rounds} rounds of {args.steps} steps), one run "
        f"per arm and seed ({said}), side by side. Bytes: the weights file each site sent (averaged.json `sent_bytes`), "
        "mean over sites and rounds. Loss: the last round's global eval loss, mean over the sites (and the seeds); "
        "vs fp32 model: the mean over the seeds of each seed's loss against model-fp32's of the same seed, "
        "with the lowest and highest.",
        "",
        "| arm | transfer | bytes/site/round | vs bf16 model | final loss | vs fp32 model | range over seeds | s |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        ratio = f"{r['bytes_vs_bf16_model']:.1%}" if r["bytes_vs_bf16_model"] is not None else "-"
        loss = f"{(r['loss_vs_fp32_model'] - 1):+.2%}" if r["loss_vs_fp32_model"] is not None else "-"
        spread = f"{r['gap_range'][0]:+.2%} .. {r['gap_range'][1]:+.2%}" if r["gap_range"] and len(seeds) > 1 else "-"
        lines.append(
            f"| {r['arm']} | {json.dumps(r['transfer']) if r['transfer'] else 'none'} | {r['bytes_per_site_round']:,.0f} | "
            f"{ratio} | {r['final_mean_loss']:.4f} | {loss} | {spread} | {r['seconds']:.0f} |"
        )
    if len(seeds) > 1:
        lines += ["", "| seed | " + " | ".join(args.arms) + " |", "| ---: |" + " ---: |" * len(args.arms)]
        for seed in seeds:
            losses = {r["arm"]: r["final_mean_loss"] for r in runs if r["seed"] == seed}
            lines.append(f"| {seed} | " + " | ".join(f"{losses[a]:.4f}" for a in args.arms) + " |")
    lines += ["", *_secure_lines(secure, command)]
    text = "\n".join(lines) + "\n"
    print(text)
    results.mkdir(exist_ok=True)
    secure_record = {"command": command, "rows": secure}
    (results / "transfer.json").write_text(
        json.dumps(
            {"command": command, "machine": machine, "arms": rows, "secure_aggregation": secure_record}, indent=2
        )
        + "\n"
    )
    (results / "transfer.md").write_text(text)


if __name__ == "__main__":
    main()
