"""The seed-style scaling table: the same training at 1 and 2 devices, locally and on Slurm.

    .venv/bin/python bench/scaling.py [--steps N] [--skip-slurm] [--quiet-wait S]

Two sweeps of the embedded default run (a tiny Llama, 4 layers x 128, on supertune's own corpus),
each `supertune sweep` followed by `supertune report`, both with --keep global-batch (16 sequences
of 128 tokens per optimizer step at every scale, so the optimisation is the same and so is the
loss):

  local   `supertune sweep --nproc 1,2`: 1 process, then 2 under torchrun (gloo) on this machine
  slurm   `supertune sweep --cluster local --gpus 1,2 --wait` on the two emulated nodes of the
          Slurm test cluster (tests/cluster, started here and stopped afterwards; needs root):
          1 node x 1 process, then 2 nodes x 1 process over the nodes' private network

A "device" is one process with one CPU thread (OMP_NUM_THREADS=1), so 2 devices have twice the
cores of 1 and the ideal speedup is 2x. Results: bench/results/scaling.md and .json (numbers,
machine, versions, the other load on the machine while each sweep ran) and each report's table and
plots in bench/results/scaling/{local,slurm}/. Work files: bench/work/scaling/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throughput.cpu import CpuWindow, wait_until_quiet
from train_throughput import machine, relative, versions

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
FIGURES = ("tokens_per_s", "speedup", "efficiency", "train_time_s", "eval_loss")
# The Slurm jobs are not this process's children: their CPU time is in the machine's, not the sweep's own.
LOAD_NAMES = {
    "local": "other load on the machine while the sweep ran",
    "slurm": "busy cores on the machine while the sweep ran, its jobs included",
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per run (default: %(default)s)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="sweeps of each kind; the table is the median round's (default: %(default)s)",
    )
    p.add_argument("--skip-slurm", action="store_true", help="only the local sweep")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60,
        help="seconds to wait for other work to leave the cores free before each sweep",
    )
    p.add_argument("--no-write", action="store_true", help="print only; write nothing to bench/results")
    return p.parse_args()


def run_overrides(steps: int) -> list[str]:
    """The embedded default run, short and quiet: no checkpoints, no saved model, no sample."""
    return [
        f"training.max_steps={steps}", "training.logging_steps=10", "training.save_strategy=no", "training.report_to=[]",
        "output.save_model=false", "generate.max_new_tokens=0", "data.max_eval_samples=200",
    ]  # fmt: skip


def supertune(*args: str, env: dict[str, str] | None = None, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supertune", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def sweep(
    kind: str, sweep_args: list[str], sweep_dir: Path, env: dict[str, str], quiet_wait: float
) -> dict[str, object]:
    """One sweep and its report; its table rows, the load beside it and where its report is."""
    work = sweep_dir.parent
    quiet = wait_until_quiet(quiet_wait)
    window = CpuWindow()
    window.start()
    argv = ["sweep", *sweep_args, "--sweep-dir", str(sweep_dir)]
    proc = supertune(*argv, env=env)
    window.stop()
    if proc.returncode != 0:
        sys.exit(f"{kind} sweep failed:\n{proc.stderr[-4000:]}")
    report = supertune("report", str(sweep_dir), env=env)
    if report.returncode != 0:
        sys.exit(f"{kind} report failed:\n{report.stderr[-2000:]}")
    rows = json.loads((sweep_dir / "report" / "report.json").read_text())["rows"]
    summaries = [json.loads((Path(r["run_dir"]) / "summary.json").read_text()) for r in rows]
    return {
        "command": "supertune " + relative(argv).replace(str(work) + "/", ""),
        "table": report.stdout,
        "rows": [{k: r[k] for k in ("devices", "nodes", *FIGURES)} for r in rows],
        "step_time_s": [s["step_time_s"] for s in summaries],
        "data_wait_share": [s["data_wait_share"] for s in summaries],
        "tflops_per_device": [s["tflops_per_device"] for s in summaries],
        "flops_formula": summaries[0]["flops_formula"],
        "wall_s": round(window.wall_s, 1),
        "other_load_cores": None if window.other_cores is None else round(window.other_cores, 2),
        "other_load_before_cores": None if quiet is None else round(quiet, 2),
        "report_dir": sweep_dir / "report",
    }


def rounds(
    kind: str, sweep_args: list[str], work: Path, env: dict[str, str], args: argparse.Namespace
) -> dict[str, object]:
    """args.rounds sweeps; the median round (by the speedup of 2 devices) with every round's speedup beside it."""
    done = []
    for i in range(1, args.rounds + 1):
        done.append(sweep(kind, sweep_args, work / f"{kind}-{i}", env, args.quiet_wait))
        print(f"{kind} round {i}: speedup {done[-1]['rows'][1]['speedup']:.2f}x", flush=True)
    ordered = sorted(done, key=lambda r: r["rows"][1]["speedup"])
    median = ordered[len(ordered) // 2]
    median["round"] = done.index(median) + 1
    median["every_round"] = [
        {
            "speedup": r["rows"][1]["speedup"],
            "tokens_per_s": [row["tokens_per_s"] for row in r["rows"]],
            "other_load_cores": r["other_load_cores"],
        }
        for r in done
    ]
    return median


def slurm_sweep(overrides: list[str], work: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, object]:
    """Start the two-node test cluster, sweep 1 and 2 nodes on it, stop it."""
    sys.path.insert(0, str(REPO / "tests"))
    from cluster.slurm_cluster import SlurmCluster

    config_dir = work / "slurm-config"
    (config_dir / "clusters").mkdir(parents=True)
    # The emulated nodes share this machine's cores: one thread per process, as locally.
    (config_dir / "clusters" / "local.yaml").write_text('env:\n  OMP_NUM_THREADS: "1"\n', encoding="utf-8")
    state = Path(tempfile.mkdtemp(prefix="supt-bench-"))  # short: Unix socket paths live under it
    with SlurmCluster() as cluster:
        cluster.start("multi", state)
        cluster_env = dict(cluster.env, SUPERTUNE_CONFIG_DIR=str(config_dir))
        result = rounds("slurm", ["--cluster", "local", "--gpus", "1,2", "--wait", *overrides], work, cluster_env, args)
    shutil.rmtree(state, ignore_errors=True)
    return result


def main() -> int:
    args = parse_args()
    from supertune.embedded.corpus import default_corpus
    from supertune.embedded.tokenizer import default_tokenizer

    default_corpus()  # built and cached once, before any clock starts
    default_tokenizer()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = BENCH / "work" / "scaling" / stamp
    work.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    overrides = run_overrides(args.steps)
    results = {"local": rounds("local", ["--nproc", "1,2", *overrides], work, env, args)}
    if not args.skip_slurm:
        results["slurm"] = slurm_sweep(overrides, work, env, args)
    for kind, r in results.items():
        two = r["rows"][1]
        print(f"{kind}: 2 devices / 1 device tokens/s: {two['speedup']:.2f}x (ideal 2.00x), efficiency {two['efficiency']:.0%}, "
              f"eval loss {r['rows'][0]['eval_loss']:.4f} vs {two['eval_loss']:.4f}")  # fmt: skip
    if not args.no_write:
        write_results(results, args, stamp)
    return 0


def write_results(results: dict[str, dict[str, object]], args: argparse.Namespace, stamp: str) -> None:
    out = RESULTS / "scaling"
    for kind, r in results.items():
        target = out / kind
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for path in Path(r["report_dir"]).iterdir():
            if path.suffix in (".md", ".png"):
                shutil.copy(path, target / path.name)
    command = relative([".venv/bin/python", "bench/scaling.py", *sys.argv[1:]])
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "steps": args.steps,
        "rounds": args.rounds,
        "machine": machine(),
        "versions": versions(),
        "sweeps": {
            k: {key: v for key, v in r.items() if key not in ("report_dir", "table")} for k, r in results.items()
        },
    }
    (RESULTS / "scaling.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "scaling.md").write_text(markdown(record, results), encoding="utf-8")
    print(f"wrote {RESULTS / 'scaling.md'}, {RESULTS / 'scaling.json'} and {out}/")


def markdown(record: dict[str, object], results: dict[str, dict[str, object]]) -> str:
    m = record["machine"]
    lines = [
        "# Scaling: the same training at 1 and 2 devices",
        "",
        f"{record['date']}, {m['usable_cores']} CPU cores ({m['cpu_model']}), torch {record['versions'].get('torch')}, "
        f"transformers {record['versions'].get('transformers')}. The embedded default run (tiny Llama, 4 layers x 128, "
        f"block 128), {record['steps']} steps of 16 sequences x 128 tokens at every scale (--keep global-batch), "
        f"{record['rounds']} rounds of each sweep, "
        "fp32, one CPU thread per process (a device = a process with one core: the ideal speedup of 2 devices is 2x). "
        "See bench/README.md.",
        "",
        "```",
        f"{record['command']}",
        "```",
        "",
    ]
    titles = {"local": "Local processes (`supertune sweep --nproc 1,2`)",
              "slurm": "Slurm, the two emulated nodes of the test cluster (`supertune sweep --cluster local --gpus 1,2 --wait`)"}  # fmt: skip
    for kind, r in results.items():
        two = r["rows"][1]
        lines += [
            f"## {titles[kind]}",
            "",
            r["table"].rstrip(),
            "",
            f"- speedup of 2 devices over 1: **{two['speedup']:.2f}x** (ideal 2.00x), efficiency {two['efficiency']:.0%}; "
            f"the table is round {r['round']} of {len(r['every_round'])}, the median; every round: "
            + ", ".join(f"{x['speedup']:.2f}x" for x in r["every_round"]),
            f"- step time {r['step_time_s'][0]:.3f} s -> {r['step_time_s'][1]:.3f} s; data-wait share "
            f"{r['data_wait_share'][0]:.1%} -> {r['data_wait_share'][1]:.1%}; "
            f"{r['tflops_per_device'][0]:.3f} -> {r['tflops_per_device'][1]:.3f} TFLOP/s per device",
            f"- {LOAD_NAMES[kind]}: {r['other_load_cores']} cores (before it: {r['other_load_before_cores']})",
            "",
            f"![speedup]({'scaling/' + kind}/speedup.png) ![tokens per device]({'scaling/' + kind}/tokens_per_device.png) "
            f"![loss]({'scaling/' + kind}/loss.png)",
            "",
        ]
    busy = results.get("local", {}).get("other_load_cores") or 0
    shared = (
        f"other work shared them ({busy} cores busy beside the local sweep; the Slurm figure above counts its own jobs "
        "too): the 2-device runs did not have both "
        "cores to themselves, which caps their speedup below what an idle machine gives"
        if busy > 0.3
        else "the machine was otherwise idle while the local sweep ran"
    )
    lines += [
        "Reading it: the eval losses agree because every scale runs the same optimisation (the same 16 sequences "
        "per step, split over the devices). The speedup counts training steps only. On this machine a device is one "
        f"of {m['usable_cores']} cores, and {shared}; each round's speedup is listed to show the spread.",
        "",
        f"FLOPs: {next(iter(results.values()))['flops_formula']}. MFU: none on CPU (no peak FLOP/s for CPUs).",
        "",
        "No GPU was available on the machine this ran on.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
