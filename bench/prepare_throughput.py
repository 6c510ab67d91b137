"""Tokenizing throughput of `supertune prepare` against a run_clm-style pipeline and the raw tokenizer,
and time to the first training step from a store against tokenizing at start, side by side.

    .venv/bin/python bench/prepare_throughput.py [--data-dir DIR] [--repeat 9] [--rounds 3]

Arms (each in its own fresh process, cold Hugging Face caches, offline, same text, same tokenizer):
  (a) supertune prepare: the CLI, writing a checked store (sources hashed, shards, offsets, manifest)
  (b) run_clm-style: datasets.map tokenize + group_texts into 512-token blocks, num_proc=2
      (bench/baselines/clm_tokenize.py)
  (c) the limit: the Rust tokenizer's encode_batch_fast alone, ids read into Python
      (bench/baselines/raw_encode.py)
Then time to first step: `supertune train` from the text files (tokenizing at start) and from the
store of arm (a), same model and settings.

Text: wikitext-2 valid.txt + test.txt, concatenated --repeat times (about 21 MB with 9). Tokenizer:
a byte-level BPE of --vocab tokens trained once with supertune's trainer, kept in bench/work/.
Every arm's tokens per second is the text's token count (without EOS, from arm (c)) divided by the
arm's seconds, so the ratios are ratios of time for the same work. Seconds are measured inside each
process after its imports (the same libraries for every arm), and also as the whole command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throughput.arms import arm_environment
from throughput.cpu import CpuWindow, usable_cores, wait_until_quiet
from train_throughput import machine, versions

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HELDOUT_LINES = 100
TARGETS = {"a/b": 2.0, "a/c": 0.8}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO.parent / "shared" / "data" / "wikitext-2",
        help="holds valid.txt and test.txt",
    )
    p.add_argument(
        "--work-dir", type=Path, default=BENCH / "work" / "prepare", help="inputs and every arm's output (git-ignored)"
    )
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--repeat", type=int, default=9, help="copies of valid+test in the text (9: about 21 MB)")
    p.add_argument("--vocab", type=int, default=8192, help="tokenizer vocabulary size")
    p.add_argument("--rounds", type=int, default=3, help="times each arm runs; medians are reported")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="seconds to wait, before each arm, for other work to use under 0.5 cores",
    )
    p.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    return p.parse_args()


def make_inputs(data_dir: Path, work: Path, repeat: int, vocab: int) -> tuple[Path, Path, Path]:
    """train.txt (valid+test x repeat), heldout.txt (its first lines) and the tokenizer directory."""
    text = "".join((data_dir / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt"))
    text = text if text.endswith("\n") else text + "\n"
    work.mkdir(parents=True, exist_ok=True)
    train, heldout = work / "train.txt", work / "heldout.txt"
    train.write_text(text * repeat, encoding="utf-8")
    heldout.write_text("\n".join(text.splitlines()[:HELDOUT_LINES]) + "\n", encoding="utf-8")
    tokenizer = work / f"tokenizer-v{vocab}"
    if not (tokenizer / "tokenizer.json").is_file():
        from supertune.embedded import train_tokenizer

        train_tokenizer([x for x in text.splitlines() if x.strip()], tokenizer, vocab_size=vocab)
    return train, heldout, tokenizer


def supertune_cli() -> list[str]:
    exe = Path(sys.executable).parent / "supertune"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "supertune"]


def run(argv: list[str], arm_dir: Path, quiet_wait: float) -> tuple[str, CpuWindow, float]:
    """Run one arm in a fresh process with its own cold caches; (stdout, cpu window, spawn unix time)."""
    shutil.rmtree(arm_dir, ignore_errors=True)
    arm_dir.mkdir(parents=True)
    wait_until_quiet(quiet_wait, 0.5)  # the machine may be shared; every arm reports the other load it saw
    window = CpuWindow()
    spawn = time.time()
    window.start()
    proc = subprocess.run(argv, env=arm_environment(arm_dir), capture_output=True, text=True, cwd=arm_dir)
    window.stop()
    if proc.returncode != 0:
        raise SystemExit(f"prepare_throughput: {shlex.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout, window, spawn


def arm_a(train: Path, heldout: Path, tok: Path, arm_dir: Path, quiet_wait: float) -> dict:
    argv = [
        sys.executable,
        str(BENCH / "throughput" / "prepare_cli.py"),
        "prepare",
        "--out",
        str(arm_dir / "store"),
        f"data.train_files={train}",
        f"data.validation_files={heldout}",
        f"model.tokenizer={tok}",
    ]
    out, window, _ = run(argv, arm_dir, quiet_wait)
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "command_s": window.wall_s, "other_cores": window.other_cores, "argv": argv}


def arm_script(script: str, train: Path, tok: Path, arm_dir: Path, quiet_wait: float, *extra: str) -> dict:
    argv = [
        sys.executable,
        str(BENCH / "baselines" / script),
        "--train-file",
        str(train),
        "--tokenizer",
        str(tok),
        *extra,
    ]
    out, window, _ = run(argv, arm_dir, quiet_wait)
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "command_s": window.wall_s, "other_cores": window.other_cores, "argv": argv}


def first_step(train: Path, heldout: Path, tok: Path, arm_dir: Path, store: Path | None, quiet_wait: float) -> dict:
    """Seconds from spawning `supertune train` to the end of its first optimizer step."""
    data = [f"data.store={store}"] if store else [f"data.train_files={train}", f"data.validation_files={heldout}"]
    argv = [
        *supertune_cli(),
        "train",
        "--run-dir",
        str(arm_dir / "run"),
        f"model.tokenizer={tok}",
        *data,
        "data.block_size=512",
        "training.max_steps=1",
        "training.per_device_train_batch_size=8",
        "training.save_strategy=no",
        "training.report_to=[]",
        "training.eval_strategy=no",
        "generate.max_new_tokens=0",
        "output.save_model=false",
    ]
    _, window, spawn = run(argv, arm_dir, quiet_wait)
    rows = [json.loads(x) for x in (arm_dir / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    first = next(r for r in rows if r.get("event") == "first_step")
    return {
        "seconds": float(first["unix_time"]) - spawn,
        "command_s": window.wall_s,
        "other_cores": window.other_cores,
        "argv": argv,
    }


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    args = parse_args()
    started = datetime.datetime.now(datetime.UTC)
    info = machine()
    train, heldout, tok = make_inputs(args.data_dir, args.work_dir, args.repeat, args.vocab)
    arms: dict[str, list[dict]] = {"a": [], "b": [], "c": [], "first_step_files": [], "first_step_store": []}
    for r in range(args.rounds):
        q = args.quiet_wait
        arms["c"].append(arm_script("raw_encode.py", train, tok, args.work_dir / "c", q))
        arms["b"].append(arm_script("clm_tokenize.py", train, tok, args.work_dir / "b", q, "--num-proc", "2"))
        arms["a"].append(arm_a(train, heldout, tok, args.work_dir / "a", q))
        store = args.work_dir / "store"
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(args.work_dir / "a" / "store", store)
        arms["first_step_files"].append(first_step(train, heldout, tok, args.work_dir / "t-files", None, q))
        arms["first_step_store"].append(first_step(train, heldout, tok, args.work_dir / "t-store", store, q))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in arms.items()), flush=True)

    tokens = arms["c"][0]["tokens"]
    seconds = {k: median(v, "seconds") for k, v in arms.items()}
    rate = {k: tokens / seconds[k] for k in ("a", "b", "c")}
    ratios = {"a/b": rate["a"] / rate["b"], "a/c": rate["a"] / rate["c"]}
    command = "bench/prepare_throughput.py " + shlex.join(sys.argv[1:])
    lines = [
        f"text: {train.stat().st_size / 1e6:.1f} MB, {tokens:,} tokens (vocabulary {args.vocab}); medians of {args.rounds} rounds on {usable_cores()} cores",
        *(f"({k}) {seconds[k]:7.2f} s  {rate[k]:12,.0f} tokens/s" for k in ("a", "b", "c")),
        *(f"{k} = {v:.2f} (target >= {TARGETS[k]})" for k, v in ratios.items()),
        f"time to first step: tokenizing at start {seconds['first_step_files']:.2f} s, from the store {seconds['first_step_store']:.2f} s",
    ]
    print("\n".join(lines))
    if args.no_write:
        return 0
    data = {
        "command": ".venv/bin/python " + command,
        "date": started.isoformat(timespec="seconds"),
        "machine": info,
        "versions": versions(),
        "text_bytes": train.stat().st_size,
        "tokens": tokens,
        "seconds_median": seconds,
        "tokens_per_second": rate,
        "ratios": ratios,
        "targets": TARGETS,
        "rounds": arms,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "prepare_throughput.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md = [
        "# Tokenizing throughput: supertune prepare",
        "",
        f"`.venv/bin/python {command}` on {started:%Y-%m-%d}, {info['cpu_model'] or 'CPU'}, {usable_cores()} usable cores, "
        f"load average at start {info['load_average_at_start']}. Medians of {args.rounds} rounds.",
        "",
        f"Text: wikitext-2 valid+test x {args.repeat} ({train.stat().st_size / 1e6:.1f} MB, {tokens:,} tokens of a {args.vocab}-token byte-level BPE).",
        "",
        "| arm | seconds (in process) | whole command, s | tokens/s | other cores busy |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    names = {
        "a": "(a) supertune prepare",
        "b": "(b) run_clm-style map + group_texts, num_proc=2",
        "c": "(c) encode_batch_fast alone (the limit)",
    }
    for k in ("a", "b", "c"):
        other = statistics.median(x["other_cores"] or 0.0 for x in arms[k])
        md.append(
            f"| {names[k]} | {seconds[k]:.2f} | {median(arms[k], 'command_s'):.2f} | {rate[k]:,.0f} | {other:.2f} |"
        )
    md += [
        "",
        *(f"- {k} = **{v:.2f}** (target >= {TARGETS[k]})" for k, v in ratios.items()),
        f"- time to first training step (spawn to end of step 1): tokenizing at start **{seconds['first_step_files']:.2f} s**, "
        f"from the store **{seconds['first_step_store']:.2f} s**",
        "",
    ]
    (args.results_dir / "prepare_throughput.md").write_text("\n".join(md), encoding="utf-8")
    print(f"prepare_throughput: wrote {args.results_dir / 'prepare_throughput.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
