"""Bytes a site sends each round, and where the federation ends, with and without compressed changes.

    PYTHONPATH=src .venv/bin/python bench/transfer.py [--rounds 3] [--steps 20] [--arms model-fp32 ...]

One federation of the embedded default (two sites, each on its own corpus, as `supertune federate`
runs with no config) per arm, side by side in one run; the arms differ only in `transfer:`:

- model-fp32: each site sends its model as trained (no transfer settings: the checkpoint's weights);
- delta-bf16, delta-int8, delta-int4: the change from the round's global model, in bf16 or
  blockwise int8 or int4 (block 64), with error feedback.

The bytes are compared with delta-bf16's, which are a bf16 model's but for a few bytes of header (2
bytes a value, the same tensors): a site sending its model in bf16 sends as many.

For each arm it reads the rounds' `averaged.json` (the weight bytes each site sent, as the round
table shows them) and `rounds.json` (the last round's global eval loss on every site), prints a
table with each arm's bytes as a fraction of a bf16 model's and its mean final loss against
model-fp32's, and writes bench/results/transfer.{json,md}. No test asserts any of it.
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


def _federation(root: Path, transfer: dict, rounds: int, steps: int) -> Path:
    sys.path.insert(0, str(REPO / "src"))
    from supertune.federation.default import site_corpus

    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        sites.append({
            "name": name,
            "overrides": [f"data.train_files={train}", f"data.validation_files={validation}",
                          "generate.max_new_tokens=0", "training.report_to=[]", "training.warmup_steps=0.1"],
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


def _arm(name: str, transfer: dict, work: Path, rounds: int, steps: int) -> dict:
    root = work / name
    root.mkdir()
    config = _federation(root, transfer, rounds, steps)
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
        "transfer": transfer,
        "bytes_per_site_round": sum(per_round) / len(per_round),
        "sent_bytes": sent,
        "final_global_loss": last,
        "final_mean_loss": sum(last.values()) / len(last),
        "seconds": round(time.time() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps per round at each site")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="supertune-transfer-bench-") as tmp:
        rows = [_arm(name, ARMS[name], Path(tmp), args.rounds, args.steps) for name in args.arms]
    by = {r["arm"]: r for r in rows}
    bf16 = by.get("delta-bf16", {}).get("bytes_per_site_round")
    fp32 = by.get("model-fp32", {}).get("final_mean_loss")
    for r in rows:
        r["bytes_vs_bf16_model"] = r["bytes_per_site_round"] / bf16 if bf16 else None
        r["loss_vs_fp32_model"] = r["final_mean_loss"] / fp32 if fp32 else None
    command = "PYTHONPATH=src .venv/bin/python bench/transfer.py " + " ".join(sys.argv[1:])
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": __import__("os").cpu_count()}
    lines = [
        "# What a site sends per round",
        "",
        f"`{command.strip()}`: the embedded federation (2 sites, {args.rounds} rounds of {args.steps} steps), one run "
        "per arm, side by side. Bytes: the weights file each site sent (averaged.json `sent_bytes`), mean over sites "
        "and rounds. Loss: the last round's global eval loss, mean over the sites.",
        "",
        "| arm | transfer | bytes/site/round | vs bf16 model | final loss | vs fp32 model | s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = f"{r['bytes_vs_bf16_model']:.1%}" if r["bytes_vs_bf16_model"] is not None else "-"
        loss = f"{(r['loss_vs_fp32_model'] - 1):+.2%}" if r["loss_vs_fp32_model"] is not None else "-"
        lines.append(
            f"| {r['arm']} | {json.dumps(r['transfer']) if r['transfer'] else 'none'} | {r['bytes_per_site_round']:,.0f} | "
            f"{ratio} | {r['final_mean_loss']:.4f} | {loss} | {r['seconds']:.0f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    results = BENCH / "results"
    results.mkdir(exist_ok=True)
    (results / "transfer.json").write_text(
        json.dumps({"command": command, "machine": machine, "arms": rows}, indent=2) + "\n"
    )
    (results / "transfer.md").write_text(text)


if __name__ == "__main__":
    main()
