"""Packing with documents kept apart against padding each document and plain packing, side by side.

    .venv/bin/python bench/packing.py [--threads N] [--steps N] [--rounds R] [--format chat]

Arms (each `supertune train` in its own fresh process, cold caches, offline, one process, the same
tiny Llama, seed, tokenizer, AdamW settings, batch 8 x --seq-len (512) slots and step count):
  (a) document-masked packing: data.packing=true data.document_mask=true, block 512
  (b) padding each document (the fine-tuning recipe): data.packing=false data.max_length=512
  (c) plain packing: data.packing=true, block 512 (documents concatenated with EOS, cut every 512)

The text is wikitext-2 valid + test, one paragraph or heading per line (real, very uneven lengths).
With --format chat the same lines become conversations (`data.format=chat`, loss on the assistant
turns): each section of an article is one conversation, the user asking about its heading and then
for more, the assistant answering with one paragraph per turn, 1 to 4 turns; results then go to
bench/results/packing-chat.json and .md.
Inputs, measurement, rounds and the quiet-machine rules are those of bench/train_throughput.py
(bench/throughput/); see bench/README.md. Results go to bench/results/packing.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import time
from pathlib import Path

from throughput.arms import Arm, ArmRun, run_arm
from throughput.cpu import usable_cores
from throughput.measure import read_supertune_metrics
from throughput.prepare import Prepared, prepare
from throughput.report import markdown_table, rounds_table, summarize, to_jsonable
from throughput.settings import BenchSettings
from train_throughput import machine, relative, versions, warm_up

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

# (name, numerator arm, denominator arm, target): ratios of median effective (non-pad) tokens/s.
TARGETS = [("a/b effective tokens/s", "a", "b", 3.0), ("a/c effective tokens/s", "a", "c", 0.85)]


# The data every arm reads, beyond the tokenizer: the text files (default), or with --format chat
# the conversation files and settings chat_inputs() makes. Set once in main(), before any arm runs.
DATA: list[str] = []


def text_inputs(p: Prepared) -> list[str]:
    return [f"data.train_files={p.train_txt}", f"data.validation_files={p.heldout_txt}"]


def chat_inputs(p: Prepared, work_dir: Path) -> list[str]:
    """Conversations made from the same wikitext-2 lines, and the settings that train on their answers.

    A heading (` = Title = `, ` = = Section = = `) opens a conversation, "Tell me about Title." and the
    section's first paragraph as the answer; "Go on." asks for each next paragraph, up to a number of
    turns drawn from 1 to 4 (seeded). Lengths follow the paragraphs': a few dozen to over a thousand
    tokens, as instruction data mixes one-line answers with long ones.
    """
    import random

    from supertune.embedded import EMBEDDED_CHAT_TEMPLATE

    rng = random.Random(0)

    def conversations(path: Path) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        title, turns, limit = "", [], 0
        for line in path.read_text(encoding="utf-8").splitlines():
            text = line.strip()
            if not text:
                continue
            heading = re.fullmatch(r"(=+) (.+?) \1", text)
            if not heading and not title:
                continue  # text before the first heading has nothing to be asked about
            if heading or len(turns) >= 2 * limit:
                if turns:
                    out.append({"messages": turns})
                title = heading.group(2) if heading else title
                turns, limit = [], rng.randint(1, 4)
                if heading:
                    continue
            question = "Go on." if turns else f"Tell me about {title}."
            turns += [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
        if turns:
            out.append({"messages": turns})
        return out

    data = work_dir / "data"
    files = {}
    for split, source in (("train", p.train_txt), ("heldout", p.heldout_txt)):
        files[split] = data / f"chat-{split}.jsonl"
        files[split].write_text("".join(json.dumps(c) + "\n" for c in conversations(source)), encoding="utf-8")
    template = data / "chat-template.jinja"
    template.write_text(EMBEDDED_CHAT_TEMPLATE, encoding="utf-8")  # the bench tokenizer has none of its own
    return [
        f"data.train_files={files['train']}",
        f"data.validation_files={files['heldout']}",
        "data.format=chat",
        f"data.chat_template={template}",
    ]


def _supertune(data_settings) -> object:
    def argv(p: Prepared, s: BenchSettings, arm_dir: Path) -> list[str]:
        exe = Path(sys.executable).parent / "supertune"
        cli = [str(exe)] if exe.is_file() else [sys.executable, "-m", "supertune"]
        return cli + [
            "train",
            "--run-dir",
            str(arm_dir / "run"),
            f"model.tokenizer={p.tokenizer_dir}",
            *DATA,
            *data_settings(s),
            # After the timed window: keep the final evaluation short, skip saving and sampling.
            f"training.per_device_eval_batch_size={s.batch_size}",
            "output.save_model=false",
            "generate.prompt=",
            *s.supertune_overrides(),
        ]

    return argv


def _records(arm_dir: Path):
    return read_supertune_metrics(arm_dir / "run" / "metrics.jsonl")


ARMS = {
    "a": Arm(
        "a",
        "document-masked packing",
        "supertune, data.document_mask=true: whole documents per block of --seq-len tokens (best-fit decreasing), positions "
        "restarting per document, SDPA with the packed-sequence mask",
        _supertune(lambda s: ["data.packing=true", "data.document_mask=true", f"data.block_size={s.seq_len}"]),
        _records,
    ),
    "b": Arm(
        "b",
        "padding each document",
        "supertune, data.packing=false: every document padded (or truncated) to --seq-len, pads out of the loss",
        _supertune(lambda s: ["data.packing=false", f"data.max_length={s.seq_len}"]),
        _records,
    ),
    "c": Arm(
        "c",
        "plain packing",
        "supertune, data.packing=true: documents concatenated with EOS between them, cut every --seq-len tokens",
        _supertune(lambda s: ["data.packing=true", f"data.block_size={s.seq_len}"]),
        _records,
    ),
}


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
        "--work-dir",
        type=Path,
        default=BENCH / "work" / "packing",
        help="prepared inputs and every arm's run (git-ignored)",
    )
    p.add_argument("--results-dir", type=Path, default=BENCH / "results", help="where packing.json/.md go")
    p.add_argument("--steps", type=int, default=24, help="optimizer steps per arm")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sequences per optimizer step")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per block and padded length (default 512; 1024 with --format chat, where the conversations "
        "run longer: the length that truncates few of them, as docs/chat.md advises)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per arm (default: torch's own, one per core)"
    )
    p.add_argument("--rounds", type=int, default=3, help="times each arm runs; the table shows medians")
    p.add_argument("--arms", default="abc", help="which arms, e.g. 'ac'")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=15.0,
        help="seconds to wait at most, before each arm, for other work to leave its cores",
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=None,
        help="a run disturbed by more busy cores than this is repeated (default: cores the arm leaves free + 0.5)",
    )
    p.add_argument(
        "--retries", type=int, default=1, help="how often a disturbed arm run is repeated; the last attempt counts"
    )
    p.add_argument(
        "--pairs", type=int, default=20, help="(a)/(c) step pairs taken in turns in one process after the arms; 0: none"
    )
    p.add_argument(
        "--format",
        choices=["text", "chat"],
        default="text",
        help="chat: the lines as conversations, loss on the answers (results in packing-chat.*)",
    )
    p.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    return p.parse_args()


def planned_padding(arm_dir: Path) -> float | None:
    """The padding share supertune logged for (a)'s training blocks (all of them, not only the steps run)."""
    found = re.search(
        r"document mask: training split, .*padding ([0-9.]+) %", (arm_dir / "output.log").read_text(errors="replace")
    )
    return float(found.group(1)) / 100 if found else None


def interleaved_steps(p: Prepared, s: BenchSettings, pairs: int) -> dict[str, object]:
    """(a) against (c) in this one process, step by step in turns: forward and backward of the same
    model (weights unchanged) on batches of each arm's rows, as supertune's data pipeline makes them.

    The arms above run in separate processes minutes apart, and on a shared machine their speed
    follows whatever else runs; a pair of steps taken back to back sees the same machine, so the
    ratio of each pair isolates what the document mask itself costs per slot.
    """
    import torch
    from transformers import default_data_collator

    from supertune.modeling.model import build_model
    from supertune.modeling.tokenizer import load_tokenizer
    from supertune.resolve import resolve_run_config
    from supertune.training_data.pipeline import build_training_data

    if s.threads:
        torch.set_num_threads(s.threads)
    common = [
        f"model.tokenizer={p.tokenizer_dir}",
        f"data.train_files={p.train_txt}",
        f"data.validation_files={p.heldout_txt}",
        f"data.block_size={s.seq_len}",
    ]
    configs = {
        "a": resolve_run_config(None, [*common, "data.document_mask=true"]),
        "c": resolve_run_config(None, common),
    }
    tokenizer = load_tokenizer(configs["a"])
    torch.manual_seed(s.seed)
    model = build_model(configs["a"].model, tokenizer).train()
    model.config.use_cache = False  # as the Trainer sets it
    rows = {k: build_training_data(c.data, tokenizer, s.seed, 1024).train for k, c in configs.items()}

    def step(k: str, i: int) -> float:
        data = rows[k]
        batch = default_data_collator([data[(i * s.batch_size + j) % len(data)] for j in range(s.batch_size)])
        started = time.perf_counter()
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step("a", 0), step("c", 0)  # warm-up
    times: dict[str, list[float]] = {"a": [], "c": []}
    for i in range(pairs):
        for k in ("a", "c") if i % 2 == 0 else ("c", "a"):
            times[k].append(step(k, i + 1))
    per_pair = [c / a for a, c in zip(times["a"], times["c"])]
    return {
        "pairs": pairs,
        "a_step_s_median": statistics.median(times["a"]),
        "c_step_s_median": statistics.median(times["c"]),
        "a_over_c_slots_per_s_median_of_pairs": statistics.median(per_pair),
        "a_over_c_slots_per_s_range": [min(per_pair), max(per_pair)],
        "a_step_s": times["a"],
        "c_step_s": times["c"],
    }


def ratios(medians: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    out = []
    for name, num, den, target in TARGETS:
        if num in medians and den in medians:
            value = medians[num]["tokens_per_second"] / medians[den]["tokens_per_second"]
            out.append({"name": name, "value": value, "target": f">= {target}", "met": value >= target})
    return out


def main() -> int:
    args = parse_args()
    seq_len = args.seq_len or (1024 if args.format == "chat" else BenchSettings().seq_len)
    settings = BenchSettings(steps=args.steps, batch_size=args.batch_size, threads=args.threads, seq_len=seq_len)
    keys = [k for k in args.arms if k in ARMS]
    started = time.time()
    machine_info = machine()
    spare = max(0, usable_cores() - (settings.threads or usable_cores()))
    if args.max_other_load is None:
        args.max_other_load = spare + 0.5
    print(f"packing: preparing inputs under {args.work_dir}", flush=True)
    prepared = prepare(args.data_dir.resolve(), args.work_dir.resolve(), settings)
    DATA[:] = chat_inputs(prepared, args.work_dir.resolve()) if args.format == "chat" else text_inputs(prepared)
    if args.format == "chat":
        args.pairs = 0  # the in-process step pairs read the text files; the arms above are the measurement
    warm_up(sys.executable)
    run_root = args.work_dir.resolve() / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rounds: list[dict[str, ArmRun]] = []
    commands: dict[str, str] = {}
    repeated: list[dict[str, object]] = []
    padding_planned: list[float] = []
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotated: slow drift favours no arm
        results: dict[str, ArmRun] = {}
        for k in order:
            print(f"packing: round {r + 1}/{args.rounds}: ({k}) {ARMS[k].name} ...", flush=True)
            for attempt in range(args.retries + 1):
                arm_dir = run_root / f"round{r + 1}" / (k if attempt == 0 else f"{k}-again{attempt}")
                run = run_arm(ARMS[k], prepared, settings, arm_dir, args.quiet_wait, spare + 0.3)
                m = run.measurement
                other = "?" if run.other_cores is None else f"{run.other_cores:.2f}"
                print(
                    f"  {m.tokens_per_second:,.0f} effective tok/s, {m.slot_tokens_per_second:,.0f} slots/s; "
                    f"padding {100 * m.padding_fraction:.1f} %; other processes used {other} cores meanwhile",
                    flush=True,
                )
                if (
                    not (run.other_cores is not None and run.other_cores > args.max_other_load)
                    or attempt == args.retries
                ):
                    break
                repeated.append({"round": r + 1, "arm": k, **run.measurement.__dict__, "other_cores": run.other_cores})
                print(f"  other work disturbed this run; running ({k}) again", flush=True)
            if k == "a" and (share := planned_padding(arm_dir)) is not None:
                padding_planned.append(share)
            commands[k] = relative(run.argv)
            results[k] = run
        rounds.append({k: results[k] for k in order})

    summary = summarize(rounds)
    medians = {k: summary.medians[k] for k in sorted(summary.medians)}
    summary.medians = medians
    names = {k: ARMS[k].name for k in keys}
    table = markdown_table(summary, names, len(rounds))
    found = ratios(medians)
    lines = [
        f"{r['name']}: {r['value']:.2f}x (target {r['target']}x: {'met' if r['met'] else 'NOT met'})" for r in found
    ]
    if "a" in medians and "c" in medians:
        lines.append(
            f"a/c all slots tokens/s: {medians['a']['slot_tokens_per_second'] / medians['c']['slot_tokens_per_second']:.2f}x "
            "(padding left out: what the mask costs, plus whatever else the machine did during each arm)"
        )
    pairs = None
    if args.pairs and "a" in keys and "c" in keys:
        print(f"packing: {args.pairs} (a)/(c) step pairs in one process ...", flush=True)
        pairs = interleaved_steps(prepared, settings, args.pairs)
        slot_ratio = pairs["a_over_c_slots_per_s_median_of_pairs"]
        lo, hi = pairs["a_over_c_slots_per_s_range"]
        padding = medians["a"]["padding_fraction"]
        lines.append(
            f"a/c slots/s in one process, {args.pairs} step pairs in turns: {slot_ratio:.2f}x (pairs {lo:.2f}-{hi:.2f}; "
            f"steps {pairs['a_step_s_median']:.3f} s and {pairs['c_step_s_median']:.3f} s): the mask's own cost; "
            f"with (a)'s {100 * padding:.1f} % padding, effective tokens/s {slot_ratio * (1 - padding):.2f}x"
        )
    print("\n" + table + "\n".join(lines))
    if not args.no_write:
        write_results(
            args,
            settings,
            prepared,
            rounds,
            repeated,
            summary,
            found,
            table,
            lines,
            commands,
            machine_info,
            padding_planned,
            pairs,
            time.time() - started,
        )
    return 0


def write_results(
    args,
    settings,
    prepared,
    rounds,
    repeated,
    summary,
    found,
    table,
    lines,
    commands,
    machine_info,
    padding_planned,
    pairs,
    wall_s,
) -> None:
    args.results_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = relative([sys.executable, *sys.argv])
    gpu = (
        "No GPU was available on the machine this ran on: the repeat on a GPU (flash attention's variable-length "
        "kernel against SDPA with the packed mask) has not been run."
    )
    planned = statistics.median(padding_planned) if padding_planned else None
    title, made = "", ""
    if args.format == "chat":
        train = args.work_dir.resolve() / "data" / "chat-train.jsonl"
        count = sum(1 for _ in train.open(encoding="utf-8"))
        title = ", conversations"
        made = (
            f", made into {count:,} conversations of 1 to 4 question/answer turns, data.format=chat, "
            "loss on the assistant turns (bench/packing.py chat_inputs)"
        )
    data = {
        "date": date,
        "command": command,
        "benchmark_wall_time_s": round(wall_s, 1),
        "machine": machine_info,
        "gpu": gpu,
        "versions": versions(),
        "settings": settings.as_dict(),
        "data": {
            "files": [str(args.data_dir / "valid.txt"), str(args.data_dir / "test.txt")],
            "sha256": prepared.text_sha256,
            "lines": prepared.num_lines,
            "non_blank_lines": prepared.num_documents,
        },
        "arms": {k: {"name": ARMS[k].name, "what": ARMS[k].description, "command": commands.get(k)} for k in rounds[0]},
        "document_mask_planned_padding": planned,
        "rounds": [
            {k: {**run.measurement.__dict__, "other_cores": run.other_cores} for k, run in r.items()} for r in rounds
        ],
        "disturbed_runs_repeated": repeated,
        **to_jsonable(summary),
        "ratios": found,
        "interleaved_step_pairs": pairs,
        "format": args.format,
    }
    stem = "packing-chat" if args.format == "chat" else "packing"
    (args.results_dir / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md = (
        f"# Packing without cross-document attention: document mask vs padding vs plain packing{title}\n\n"
        f"{date}, {machine_info['usable_cores']} CPU cores ({machine_info['cpu_model'] or 'unknown CPU'}), "
        f"torch {data['versions']['torch']}, transformers {data['versions']['transformers']}.\n"
        f"wikitext-2 valid+test ({prepared.num_documents:,} non-blank lines: paragraphs and headings{made}), tiny Llama "
        f"(supertune's embedded config), batch {settings.batch_size} x {settings.seq_len} slots, {settings.steps} AdamW steps, "
        f"one process per arm with {settings.threads or 'the default number of'} torch thread(s), SDPA attention, cold caches. "
        "Effective tok/s: non-pad tokens of steps 2..N over their wall time. See bench/README.md.\n\n"
        f"```\n{command}\n```\n\n"
        + table
        + "\n"
        + "\n".join(f"- {line}" for line in lines)
        + "\n"
        + (
            f"- (a)'s padding over all its training blocks, as the run logs it: {100 * planned:.1f} %.\n"
            if planned is not None
            else ""
        )
        + f"\n{gpu}\n"
        "\n## Every round, in the order run\n\n"
        + rounds_table(rounds, {k: ARMS[k].name for k in rounds[0]})
        + (f"\n{len(repeated)} disturbed arm run(s) were run again; see {stem}.json.\n" if repeated else "")
    )
    (args.results_dir / f"{stem}.md").write_text(md, encoding="utf-8")
    print(f"\npacking: wrote {args.results_dir / stem}.json and .md")


if __name__ == "__main__":
    sys.exit(main())
