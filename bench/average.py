"""Averaging 4 models of about 500 MB: supertune average against the recipe it replaces, mergekit's linear
merge, and the time it takes just to read the inputs, side by side in one run.

    .venv/bin/python bench/average.py [--rounds 3] [--count 4] [--models-dir DIR]

Arms (each a fresh process, the inputs' pages dropped from the page cache before it starts):
  (a) supertune average M1 M2 M3 M4 --out DIR --weights uniform        (float32 in, float32 out)
  (b) the recipe: every model loaded whole with from_pretrained, state dicts averaged, save_pretrained
      (bench/average/naive_from_pretrained.py)
  (c) mergekit-yaml with merge_method linear, equal weights, normalize, dtype float32, in its own
      virtual environment (bench/.venv-mergekit, made on first use with torch 2.13.0 first)
  (d) cat of the inputs' safetensors files to /dev/null: the disk's limit
Every arm averages with equal weights, so (a), (b) and (c) must write the same tensors: the first
round compares them. Wall time from spawn to exit and peak resident memory (/usr/bin/time's %M, the
child's own maximum RSS) are recorded per arm and round; the order of the arms rotates each round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from throughput.cpu import CpuWindow, usable_cores, wait_until_quiet
from train_throughput import machine, versions

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MERGEKIT_VENV = BENCH / ".venv-mergekit"
TIME = "/usr/bin/time"
NAMES = {
    "a": "(a) supertune average",
    "b": "(b) from_pretrained, average, save_pretrained (the recipe)",
    "c": "(c) mergekit linear merge",
    "d": "(d) cat inputs > /dev/null (disk limit)",
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models-dir",
        type=Path,
        default=Path("/tmp/supertune-bench-average"),
        help="inputs and outputs (not in the repository)",
    )
    p.add_argument("--count", type=int, default=4, help="models to average")
    p.add_argument("--rounds", type=int, default=3, help="times each arm runs; medians are reported")
    p.add_argument("--arms", default="abcd")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="seconds to wait, before each arm, for other work to use under 0.5 cores",
    )
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    return p.parse_args()


def ensure_mergekit() -> str:
    """mergekit's version, installing it into its own virtual environment on first use."""
    python = MERGEKIT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(MERGEKIT_VENV)], check=True)
        # torch first and pinned: mergekit's requirement would otherwise pull a CUDA build
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "mergekit"], check=True)
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.version('mergekit'), m.version('transformers'), m.version('torch'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def make_inputs(root: Path, count: int) -> list[Path]:
    """The input models, made in a child process so that this one stays small (its peak memory is inherited by what it spawns)."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1])\n"
        "from average.inputs import make_models\nfrom supertune.embedded import default_tokenizer\n"
        "print('\\n'.join(str(p) for p in make_models(Path(sys.argv[2]), int(sys.argv[3]), default_tokenizer())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), str(root / "inputs"), str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(x) for x in out.stdout.split()]


def drop_cached(paths: list[Path]) -> None:
    """Flush written data, then ask the kernel to forget the inputs' cached pages: every arm reads them from disk."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def arm_argv(key: str, inputs: list[Path], out: Path, work: Path) -> list[str]:
    if key == "a":
        exe = Path(sys.executable).parent / "supertune"
        return [str(exe), "average", *map(str, inputs), "--out", str(out), "--weights", "uniform"]
    if key == "b":
        return [
            sys.executable,
            str(BENCH / "average" / "naive_from_pretrained.py"),
            "--out",
            str(out),
            *map(str, inputs),
        ]
    if key == "c":
        config = work / "mergekit.yml"
        models = "".join(f"  - model: {p}\n    parameters: {{weight: 1.0}}\n" for p in inputs)
        config.write_text(f"merge_method: linear\nmodels:\n{models}parameters: {{normalize: true}}\ndtype: float32\n")
        return [str(MERGEKIT_VENV / "bin" / "mergekit-yaml"), str(config), str(out), "--quiet"]
    if key == "d":
        return [
            "sh",
            "-c",
            "cat " + " ".join(shlex.quote(str(p / "model.safetensors")) for p in inputs) + " > /dev/null",
        ]
    raise ValueError(key)


def run_arm(key: str, inputs: list[Path], work: Path, quiet_wait: float) -> dict:
    out = work / f"out-{key}"
    shutil.rmtree(out, ignore_errors=True)
    argv = arm_argv(key, inputs, out, work)
    drop_cached([p / "model.safetensors" for p in inputs])
    wait_until_quiet(quiet_wait, 0.5)
    usage = work / "time.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    window = CpuWindow()
    window.start()
    proc = subprocess.run(
        [TIME, "-f", "%M", "-o", str(usage), *argv], capture_output=True, text=True, env=env, cwd=work
    )
    window.stop()
    if proc.returncode != 0:
        raise SystemExit(f"average bench: arm {key} failed: {shlex.join(argv)}\n{proc.stderr[-3000:]}")
    return {
        "seconds": window.wall_s,
        "peak_rss_mb": int(usage.read_text().split()[-1]) * 1024 / 1e6,
        "cpu_s": window.arm_cpu_s,
        "other_cores": window.other_cores,
        "argv": argv,
    }


def compare_outputs(work: Path, keys: list[str]) -> dict[str, float]:
    """Largest absolute difference of every tensor of (b) and (c) from (a)'s, in a child process."""
    code = (
        "import json, sys, numpy as np\nfrom pathlib import Path\nfrom safetensors.numpy import load_file\n"
        "def load(d):\n    out = {}\n    for f in sorted(Path(d).glob('*.safetensors')):\n        out.update(load_file(f))\n    return out\n"
        "a = load(sys.argv[1]); res = {}\n"
        "for d in sys.argv[2:]:\n    o = load(d); assert o.keys() == a.keys(), d\n"
        "    res[Path(d).name] = max(float(np.abs(o[k].astype(np.float64) - a[k]).max()) for k in a)\n    del o\n"
        "print(json.dumps(res))"
    )
    others = [str(work / f"out-{k}") for k in keys if k in "bc"]
    out = subprocess.run(
        [sys.executable, "-c", code, str(work / "out-a"), *others], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main() -> int:
    args = parse_args()
    if not Path(TIME).is_file():
        raise SystemExit(f"average bench: needs {TIME} (GNU time) for the peak memory of each arm")
    started = datetime.datetime.now(datetime.UTC)
    info = machine()
    keys = [k for k in "abcd" if k in args.arms]
    mergekit = ensure_mergekit() if "c" in keys else None
    work = args.models_dir
    work.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs(work, args.count)
    sys.path.insert(0, str(BENCH))
    from average.inputs import model_bytes

    total_bytes, largest = model_bytes()
    rounds: dict[str, list[dict]] = {k: [] for k in keys}
    differences = None
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            rounds[key].append(run_arm(key, inputs, work, args.quiet_wait))
        if r == 0 and "a" in keys and len(set(keys) & set("bc")):
            differences = compare_outputs(work, keys)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k} {rounds[k][-1]['seconds']:.2f} s {rounds[k][-1]['peak_rss_mb']:.0f} MB" for k in keys),
            flush=True,
        )
    for key in keys:
        shutil.rmtree(work / f"out-{key}", ignore_errors=True)

    med = {
        k: {m: statistics.median(x[m] for x in rounds[k]) for m in ("seconds", "peak_rss_mb", "cpu_s")} for k in keys
    }
    rss_limit_mb = (2 * largest + 300e6) / 1e6
    ratios = {
        f"{x}/{y}": med[x]["seconds"] / med[y]["seconds"]
        for x, y in (("a", "d"), ("a", "b"), ("a", "c"))
        if x in med and y in med
    }
    targets = {
        "a/d": "<= 1.5",
        "a/b": "< 1",
        "a/c": "< 1",
        "a peak RSS": f"<= 2 x largest tensor + 300 MB = {rss_limit_mb:.0f} MB",
    }
    lines = [
        f"{args.count} inputs of {total_bytes / 1e6:.0f} MB (float32, largest tensor {largest / 1e6:.0f} MB); medians of {args.rounds} rounds",
        *(f"{NAMES[k]:60s} {med[k]['seconds']:7.2f} s {med[k]['peak_rss_mb']:8.0f} MB" for k in keys),
        *(f"{k} = {v:.2f} (target {targets[k]})" for k, v in ratios.items()),
    ]
    if "a" in med:
        lines.append(f"a peak RSS {med['a']['peak_rss_mb']:.0f} MB (target {targets['a peak RSS']})")
    if differences:
        lines.append("largest difference from (a): " + ", ".join(f"{k} {v:.3g}" for k, v in differences.items()))
    print("\n".join(lines))
    if args.no_write:
        return 0
    command = ".venv/bin/python bench/average.py " + shlex.join(sys.argv[1:])
    data = {
        "command": command.strip(),
        "date": started.isoformat(timespec="seconds"),
        "machine": info,
        "versions": {**versions(), "mergekit (own venv: mergekit transformers torch)": mergekit},
        "inputs": {"count": args.count, "bytes_each": total_bytes, "largest_tensor_bytes": largest, "dtype": "float32"},
        "medians": med,
        "ratios": ratios,
        "targets": targets,
        "largest_difference_from_a": differences,
        "rounds": rounds,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "average.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md = [
        "# Averaging 4 models: supertune average",
        "",
        f"`{command.strip()}` on {started:%Y-%m-%d}, {info['cpu_model'] or 'CPU'}, {usable_cores()} usable cores, "
        f"load average at start {info['load_average_at_start']}. Medians of {args.rounds} rounds; every arm a fresh process "
        "with the inputs dropped from the page cache.",
        "",
        f"Inputs: {args.count} Llama-shaped models of {total_bytes / 1e6:.0f} MB each in float32 (largest tensor {largest / 1e6:.0f} MB), "
        "averaged with equal weights into float32."
        + (f" mergekit, transformers, torch in (c)'s own virtual environment: {mergekit}." if mergekit else ""),
        "",
        "| arm | seconds | peak RSS (MB) | CPU seconds | other cores busy |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for k in keys:
        other = statistics.median(x["other_cores"] or 0.0 for x in rounds[k])
        md.append(
            f"| {NAMES[k]} | {med[k]['seconds']:.2f} | {med[k]['peak_rss_mb']:.0f} | {med[k]['cpu_s']:.2f} | {other:.2f} |"
        )
    md += ["", *(f"- {k} = **{v:.2f}** (target {targets[k]})" for k, v in ratios.items())]
    if "a" in med:
        md.append(f"- (a) peak RSS **{med['a']['peak_rss_mb']:.0f} MB** (target {targets['a peak RSS']})")
    if differences:
        md.append(
            "- largest absolute difference of any weight from (a)'s: "
            + ", ".join(f"{k} {v:.3g}" for k, v in differences.items())
        )
    md += [
        "",
        "Every round:",
        "",
        "| round | " + " | ".join(f"({k}) s / MB" for k in keys) + " |",
        "| --- |" + " ---: |" * len(keys),
    ]
    for r in range(args.rounds):
        md.append(
            f"| {r + 1} | "
            + " | ".join(f"{rounds[k][r]['seconds']:.2f} / {rounds[k][r]['peak_rss_mb']:.0f}" for k in keys)
            + " |"
        )
    (args.results_dir / "average.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print(f"average bench: wrote {args.results_dir / 'average.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
