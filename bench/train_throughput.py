"""Training throughput and time to first step: supertune against two plain-Trainer recipes, side by side.

    .venv/bin/python bench/train_throughput.py [--data-dir DIR] [--steps N] [--rounds R]

Arms (each in its own fresh process, cold Hugging Face caches, offline, one process, same tiny
Llama, same seed, same tokenizer, same AdamW settings, same batch and step count):
  (a) supertune: the `supertune train` CLI, packing into 512-token blocks, training.speed=plain
  (b) the tutorial recipe: every document padded/truncated to 512 (bench/baselines/padded_trainer.py)
  (c) the run_clm-style recipe: datasets.map tokenize + group into 512-token blocks (bench/baselines/clm_group_texts.py)
  (d) supertune as (a) with training.speed=auto, the default (the exact speed-ups the CPU allows)

See bench/README.md for what is measured and how; results go to bench/results/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from throughput.arms import ARMS, ArmRun, run_arm
from throughput.cpu import usable_cores
from throughput.prepare import Prepared, prepare
from throughput.report import Summary, markdown_table, ratio_lines, rounds_table, summarize, to_jsonable
from throughput.settings import BenchSettings

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PACKAGES = [
    "supertune",
    "torch",
    "transformers",
    "datasets",
    "tokenizers",
    "accelerate",
    "peft",
    "deepspeed",
    "numpy",
    "huggingface_hub",
]


def parse_args() -> argparse.Namespace:
    defaults = BenchSettings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO.parent / "shared" / "data" / "wikitext-2",
        help="holds valid.txt and test.txt",
    )
    p.add_argument(
        "--work-dir", type=Path, default=BENCH / "work", help="prepared inputs and every arm's run (git-ignored)"
    )
    p.add_argument("--results-dir", type=Path, default=BENCH / "results", help="where train_throughput.json/.md go")
    p.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps per arm")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sequences per optimizer step")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per arm (default: torch's own, one per core)"
    )
    p.add_argument("--rounds", type=int, default=3, help="times each arm runs; the table shows medians")
    p.add_argument("--arms", default="abcd", help="which arms, e.g. 'ac'")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=15.0,
        help="seconds to wait at most, before each arm, for other work to leave the cores the arm will use",
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=None,
        help="an arm run during which other processes kept more cores than this busy is run again (see --retries); "
        "default: the cores the arm's threads leave free, plus 0.5",
    )
    p.add_argument(
        "--retries", type=int, default=1, help="how often a disturbed arm run is repeated; the last attempt counts"
    )
    p.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    return p.parse_args()


def warm_up(env_python: str) -> None:
    """Import the heavy libraries once so the first arm does not pay cold disk reads the others would not."""
    code = (
        "import torch, datasets, numpy; from transformers import Trainer, LlamaForCausalLM; import supertune.cli.main"
    )
    subprocess.run([env_python, "-c", code], check=True, stdout=subprocess.DEVNULL)


def machine() -> dict[str, object]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cpu_model": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def relative(argv: list[str]) -> str:
    """A command line with this checkout's paths shortened, for the results file."""
    text = shlex.join(argv)
    return text.replace(str(REPO) + "/", "")


def main() -> int:
    args = parse_args()
    settings = BenchSettings(steps=args.steps, batch_size=args.batch_size, threads=args.threads)
    keys = [k for k in args.arms if k in ARMS]
    started = time.time()
    machine_info = machine()  # before any arm runs: the load average then says how busy the machine was
    cores = usable_cores()
    # Other work only slows an arm down once it wants cores the arm's threads would use.
    spare = max(0, cores - (settings.threads or cores))
    if args.max_other_load is None:
        args.max_other_load = spare + 0.5
    quiet_cores = spare + 0.3
    print(f"train_throughput: preparing inputs under {args.work_dir}", flush=True)
    prepared = prepare(args.data_dir.resolve(), args.work_dir.resolve(), settings)
    warm_up(sys.executable)
    run_root = args.work_dir.resolve() / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rounds: list[dict[str, ArmRun]] = []
    commands: dict[str, str] = {}
    repeated: list[dict[str, object]] = []
    for r in range(args.rounds):
        # Rotate the order each round so that slow drift of a shared machine does not favour one arm.
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        results: dict[str, ArmRun] = {}
        for k in order:
            arm = ARMS[k]
            print(f"train_throughput: round {r + 1}/{args.rounds}: ({k}) {arm.name} ...", flush=True)
            for attempt in range(args.retries + 1):
                name = k if attempt == 0 else f"{k}-again{attempt}"
                run = run_arm(arm, prepared, settings, run_root / f"round{r + 1}" / name, args.quiet_wait, quiet_cores)
                m = run.measurement
                other = "?" if run.other_cores is None else f"{run.other_cores:.2f}"
                print(
                    f"  first step after {m.time_to_first_step_s:.1f} s; {m.tokens_per_second:,.0f} effective tok/s; "
                    f"padding {100 * m.padding_fraction:.1f} %; other processes used {other} cores meanwhile",
                    flush=True,
                )
                disturbed = run.other_cores is not None and run.other_cores > args.max_other_load
                if not disturbed or attempt == args.retries:
                    break
                # Kept in the results file, left out of the tables.
                repeated.append({"round": r + 1, "arm": k, **_run_record(run)})
                print(f"  other work disturbed this run; running ({k}) again", flush=True)
            commands[k] = relative(run.argv)
            results[k] = run
        rounds.append({k: results[k] for k in order})

    summary = summarize(rounds)
    names = {k: ARMS[k].name for k in keys}
    table = markdown_table(summary, names, len(rounds))
    lines = ratio_lines(summary)
    print()
    print(table)
    print("\n".join(lines))
    if not args.no_write:
        write_results(
            args,
            settings,
            prepared,
            rounds,
            repeated,
            summary,
            table,
            lines,
            commands,
            machine_info,
            time.time() - started,
        )
    return 0


def _run_record(run: ArmRun) -> dict[str, object]:
    return {
        **run.measurement.__dict__,
        "process_wall_s": run.process_wall_s,
        "process_cpu_s": run.process_cpu_s,
        "other_cores": run.other_cores,
        "other_cores_before": run.other_cores_before,
    }


def write_results(
    args: argparse.Namespace,
    settings: BenchSettings,
    prepared: Prepared,
    rounds: list[dict[str, ArmRun]],
    repeated: list[dict[str, object]],
    summary: Summary,
    table: str,
    lines: list[str],
    commands: dict[str, str],
    machine_info: dict[str, object],
    wall_s: float,
) -> None:
    results_dir = args.results_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = relative([sys.executable, *sys.argv])
    data = {
        "date": date,
        "command": command,
        "benchmark_wall_time_s": round(wall_s, 1),
        "machine": machine_info,
        "versions": versions(),
        "settings": settings.as_dict(),
        "data": {
            "files": [str(args.data_dir / "valid.txt"), str(args.data_dir / "test.txt")],
            "sha256": prepared.text_sha256,
            "lines": prepared.num_lines,
            "non_blank_lines": prepared.num_documents,
        },
        "arms": {k: {"name": ARMS[k].name, "what": ARMS[k].description, "command": commands.get(k)} for k in rounds[0]},
        "rounds": [{k: _run_record(run) for k, run in r.items()} for r in rounds],
        "disturbed_runs_repeated": repeated,
        **to_jsonable(summary),
    }
    (results_dir / "train_throughput.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md = (
        "# Training throughput: supertune vs plain-Trainer recipes\n\n"
        f"{date}, {machine_info['usable_cores']} CPU cores ({machine_info['cpu_model'] or 'unknown CPU'}), "
        f"torch {data['versions']['torch']}, transformers {data['versions']['transformers']}, "
        f"datasets {data['versions']['datasets']}.\n"
        f"wikitext-2 valid+test, tiny Llama (supertune's embedded config), batch {settings.batch_size} x {settings.seq_len} "
        f"tokens, {settings.steps} AdamW steps, one process per arm with "
        f"{settings.threads or 'the default number of'} torch thread(s), cold caches. "
        "Time to first step: process spawn to the end of optimizer step 1. Effective tok/s: non-pad tokens of steps "
        "2..N over their wall time. See bench/README.md.\n\n"
        f"```\n{command}\n```\n\n" + table + "\n" + "\n".join(f"- {line}" for line in lines) + "\n"
        "\n## Every round, in the order run\n\n"
        + rounds_table(rounds, {k: ARMS[k].name for k in rounds[0]})
        + (
            f"\n{len(repeated)} arm run(s) during which other processes kept more than {args.max_other_load} cores busy "
            "were run again; they are listed in train_throughput.json under disturbed_runs_repeated.\n"
            if repeated
            else ""
        )
    )
    (results_dir / "train_throughput.md").write_text(md, encoding="utf-8")
    print(
        f"\ntrain_throughput: wrote {results_dir / 'train_throughput.json'} and {results_dir / 'train_throughput.md'}"
    )


if __name__ == "__main__":
    sys.exit(main())
