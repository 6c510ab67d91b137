"""Where the federation ends with differential privacy, against the noise multiplier, and the epsilon spent.

    PYTHONPATH=src .venv/bin/python bench/privacy.py [--rounds 3] [--steps 30] [--clip-norm 1.0]
        [--multipliers 0 0.5 1 2] [--parallel 2]

One federation of the embedded default (two sites, each on its own corpus, the 2-layer tiny Llama) per
arm; the arms differ only in `privacy.noise_multiplier`, beside one without privacy settings. Every
arm sends its change (`transfer.delta: true`, codec same) and averages with uniform weights, which
privacy needs, so that the arm without privacy differs from the others only in the clipping and noise.

For each arm it reads `rounds.json`: the last round's global eval loss on every site and the epsilon
spent at delta 1e-5 (the Opacus RDP accountant over the rounds), and from the federation's log each
site's change's L2 norm before clipping. It prints a table and writes bench/results/privacy.{json,md}.
No test asserts any of it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DELTA = 1e-5
NORM = re.compile(r"its change's L2 norm ([0-9.eE+-]+), clipped to")


def _config(privacy: dict | None, rounds: int, steps: int) -> dict:
    sys.path.insert(0, str(REPO / "src"))
    from supertune.federation.config.default import site_corpus

    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0",
                     "training.report_to=[]", "training.warmup_steps=0.1"]  # fmt: skip
        sites.append({"name": name, "overrides": overrides, "steps_per_round": steps})
    config = {"name": "privacy-bench", "rounds": rounds, "sites": sites, "transfer": {"delta": True},
              "aggregation": {"weights": "uniform"}}  # fmt: skip
    if privacy is not None:
        config["privacy"] = {**privacy, "delta": DELTA}
    return config


def _arm(name: str, privacy: dict | None, work: Path, rounds: int, steps: int) -> dict:
    root = work / name
    root.mkdir()
    (root / "federation.yaml").write_text(yaml.safe_dump(_config(privacy, rounds, steps), sort_keys=False))
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(root / "federation.yaml"), "--dir", str(root / "fed")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name}: federate failed:\n{proc.stderr[-3000:]}")
    table = json.loads((root / "fed" / "rounds.json").read_text())
    last = [r for r in table["rows"] if r["round"] == rounds]
    norms = [float(m) for m in NORM.findall(proc.stderr)]
    epsilon = last[0].get("epsilon")
    return {
        "arm": name,
        "privacy": privacy,
        "final_global_loss": {r["site"]: r["global"] for r in last},
        "final_mean_loss": sum(r["global"] for r in last) / len(last),
        "base_mean_loss": sum(table["base"].values()) / len(table["base"]),
        "epsilon": epsilon if privacy and privacy.get("noise_multiplier") else None,
        "change_norms": norms,
        "seconds": round(time.time() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="steps per round at each site")
    parser.add_argument("--clip-norm", type=float, default=1.0)
    parser.add_argument("--multipliers", nargs="+", type=float, default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--parallel", type=int, default=2, help="federations run at once")
    args = parser.parse_args()
    arms: dict[str, dict | None] = {"no privacy": None}
    arms |= {f"z={z:g}": {"clip_norm": args.clip_norm, "noise_multiplier": z} for z in args.multipliers}
    with tempfile.TemporaryDirectory(prefix="supertune-privacy-bench-") as tmp:
        with ThreadPoolExecutor(args.parallel) as pool:
            futures = [
                pool.submit(_arm, f"arm{i}", privacy, Path(tmp), args.rounds, args.steps)
                for i, privacy in enumerate(arms.values())
            ]
            runs = [f.result() for f in futures]
    for name, run in zip(arms, runs):
        run["arm"] = name
    command = "PYTHONPATH=src .venv/bin/python bench/privacy.py " + " ".join(sys.argv[1:])
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    norms = [n for r in runs for n in r["change_norms"]]
    lines = [
        "# Final loss against the noise multiplier",
        "",
        f"`{command.strip()}`: the embedded federation (2 sites, {args.rounds} rounds of {args.steps} steps, the "
        f"2-layer tiny Llama), changes sent in float32 (`transfer.delta: true`), uniform weights; privacy.clip_norm "
        f"{args.clip_norm:g}, delta {DELTA:g}; {args.parallel} federations at a time on {machine['cpus']} CPU cores. "
        "Loss: the last round's global eval loss, mean over the two sites (the base model's: "
        f"{runs[0]['base_mean_loss']:.4f}). Epsilon: spent after the last round (Opacus RDP accountant, sampling rate 1). "
        "Change norm: each site's change's L2 norm before clipping, as its log says, over sites and rounds.",
        "",
        "| arm | noise multiplier | final loss | epsilon at delta 1e-5 | change norm before clipping: median (lowest .. highest) | s |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in runs:
        z = "-" if r["privacy"] is None else f"{r['privacy']['noise_multiplier']:g}"
        epsilon = "-" if r["privacy"] is None else ("inf" if r["epsilon"] is None else f"{r['epsilon']:.2f}")
        n = r["change_norms"]
        spread = f"{statistics.median(n):.3f} ({min(n):.3f} .. {max(n):.3f})" if n else "-"
        lines.append(f"| {r['arm']} | {z} | {r['final_mean_loss']:.4f} | {epsilon} | {spread} | {r['seconds']:.0f} |")
    if norms:
        lines += ["", f"Every change was {'clipped' if min(norms) > args.clip_norm else 'not always clipped'} "
                  f"(norms {min(norms):.3f} .. {max(norms):.3f} against clip_norm {args.clip_norm:g})."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    results = BENCH / "results"
    results.mkdir(exist_ok=True)
    (results / "privacy.json").write_text(
        json.dumps({"command": command, "machine": machine, "arms": runs}, indent=2) + "\n"
    )
    (results / "privacy.md").write_text(text)


if __name__ == "__main__":
    main()
