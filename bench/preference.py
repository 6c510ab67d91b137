"""Preference tuning: packed DPO against a padded DPO batch, and the memory of the precomputed reference
against a second reference model, side by side.

    .venv/bin/python bench/preference.py [--threads N] [--steps N] [--pairs-per-step N] [--block-size N]
                                         [--memory-hidden N] [--memory-layers N] [--memory-steps N]

Pairs: wikitext-2 (valid + test, /work/shared/data/wikitext-2) paragraphs of at least 60 words,
each cut into a prompt of 10 to 150 words, a chosen answer (the words after it) and a rejected
answer (the opening of another paragraph), each answer 5 to 250 words, drawn uniformly and apart
(seeded): prompts of a few dozen to a few hundred tokens, answers of a few to several hundred, of
different lengths in one pair, as real preference data has them. Plain-text rows, encoded as a run
encodes them (supertune.conversations.preference), with the embedded 1,540-token BPE.

1. Effective tokens/s: DPO training steps (forward and backward of the loss, AdamW step) of the
   embedded tiny Llama (1.25 M parameters, SDPA, float32) on the same pairs, --pairs-per-step a
   step, in two layouts taken in turns in one process (step 1 of each, then step 2 of each, ...):
   (a) supertune's packed batch (PackedPreferenceCollator: whole pairs in document-masked rows of
   up to --block-size tokens, padded to the batch's longest row) against (b) the padded batch TRL's
   default collator makes (each batch padded to its longest sequence, the chosen rows stacked on the
   rejected ones; supertune's own padded PreferenceCollator, which is that recipe). The reference
   log-probabilities are computed once before (as a full fine-tuning run does) for both. Effective
   tokens: prompt and answer tokens that are not padding; tokens/s over the steps after the first
   of each arm. The ratio a/b is printed.
2. Peak memory: a full fine-tuning DPO step with the reference precomputed (one model) against one
   that holds a second copy of the model as the live reference, each in a fresh process, a larger
   Llama (--memory-hidden, --memory-layers) so that the weights and not the interpreter dominate.
   Peak RSS (VmHWM of /proc/self/status: torch's CPU tensors live outside Python's allocator, so
   tracemalloc does not see them; getrusage's ru_maxrss would keep the peak of this parent process
   across fork and exec), reported whole and above the process's RSS before the model was built
   (imports, tokenizer, pairs).

Results go to bench/results/preference.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "src"))

WIKITEXT = Path("/work/shared/data/wikitext-2")
TARGETS = {"a/b effective tokens/s": 2.0, "precomputed/two models peak memory": 0.6}


def make_pairs(count: int, seed: int = 0) -> dict[str, list[str]]:
    """Plain-text {prompt, chosen, rejected} rows of varied lengths from wikitext-2 paragraphs (see the module)."""
    lines = []
    for name in ("valid.txt", "test.txt"):
        for line in (WIKITEXT / name).read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 60 and not line.strip().startswith("="):
                lines.append(words)
    rng = random.Random(seed)
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(count):
        words, other = rng.choice(lines), rng.choice(lines)
        cut = rng.randint(10, min(150, len(words) - 5))
        chosen = words[cut : cut + rng.randint(5, 250)]
        rejected = other[: rng.randint(5, 250)]
        if chosen == rejected:
            rejected = rejected[1:]
        rows["prompt"].append(" ".join(words[:cut]))
        rows["chosen"].append(" " + " ".join(chosen))
        rows["rejected"].append(" " + " ".join(rejected))
    return rows


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer

    return AutoTokenizer.from_pretrained(str(default_tokenizer()))


def _rows(tokenizer: Any, count: int, seed: int) -> Any:
    from supertune.config.schema import DataConfig
    from supertune.conversations.preference import encode_pairs
    from supertune.training_data.preference_data import PreferenceRows

    encoded = encode_pairs(make_pairs(count, seed), DataConfig(), tokenizer, "the benchmark's pairs", 0)
    return PreferenceRows([c for c, _ in encoded], [r for _, r in encoded])


def _model(tokenizer: Any, **overrides: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from supertune.embedded.model import default_model_config
    from supertune.modeling.packed_attention import keep_packed_rows_apart

    torch.manual_seed(0)
    config = default_model_config(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    model = AutoModelForCausalLM.from_config(
        LlamaConfig(**{**config, **overrides}), attn_implementation="sdpa", dtype=torch.float32
    )
    model.config.use_cache = False
    keep_packed_rows_apart(model)  # as build_model installs it for document-masked rows
    return model


def _dpo() -> Any:
    from supertune.config.schema import TrainingConfig
    from supertune.train.preference.preference_scoring import PreferenceScorer

    return PreferenceScorer(TrainingConfig(objective="dpo"), "precomputed")


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from supertune.train.preference.preference_reference import attach_reference
    from supertune.training_data.preference_data import PackedPreferenceCollator, PreferenceCollator

    tokenizer = _tokenizer()
    rows = _rows(tokenizer, args.pairs_per_step * args.steps, args.seed)
    model = _model(tokenizer)
    padded = PreferenceCollator(tokenizer.pad_token_id)
    packed = PackedPreferenceCollator(tokenizer.pad_token_id, args.block_size)
    attach_reference(model, [rows], padded, args.pairs_per_step, torch.device("cpu"))
    scorer = _dpo()
    start_state = copy.deepcopy(model.state_dict())
    arms = {"a": packed, "b": padded}
    models = {}
    for name in arms:  # each arm trains its own copy from the same start
        models[name] = model if name == "a" else copy.deepcopy(model)
        models[name].load_state_dict(start_state)
        models[name].train()
    optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in models.items()}
    records: dict[str, list[dict[str, float]]] = {n: [] for n in arms}
    for step in range(args.steps):
        items = [rows[i] for i in range(step * args.pairs_per_step, (step + 1) * args.pairs_per_step)]
        for name, collator in arms.items():
            started = time.perf_counter()
            batch = collator(items)
            out = scorer.loss(models[name], batch)
            out.loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            seconds = time.perf_counter() - started
            real = int(sum(len(it["first"].ids) + len(it["second"].ids) for it in items))
            records[name].append(
                {
                    "seconds": seconds,
                    "tokens": real,
                    "slots": int(batch["input_ids"].numel()),
                    "loss": float(out.loss.detach()),
                }
            )
    result: dict[str, Any] = {}
    for name, recs in records.items():
        timed = recs[1:]  # the first step of each arm warms its kernels up
        seconds = sum(r["seconds"] for r in timed)
        tokens, slots = sum(r["tokens"] for r in timed), sum(r["slots"] for r in timed)
        result[name] = {
            "effective_tokens_per_s": tokens / seconds,
            "slots_per_s": slots / seconds,
            "padding_share": 1 - tokens / slots,
            "median_step_s": sorted(r["seconds"] for r in timed)[len(timed) // 2],
            "losses": [r["loss"] for r in recs],
        }
    result["ratio"] = result["a"]["effective_tokens_per_s"] / result["b"]["effective_tokens_per_s"]
    result["loss_difference"] = max(abs(x - y) for x, y in zip(result["a"]["losses"], result["b"]["losses"]))
    lengths = [len(rows.first[i].ids) + len(rows.second[i].ids) for i in range(len(rows))]
    answers = [int(a.mask.sum()) for a in rows.first + rows.second]
    result["pairs"] = {
        "count": len(rows),
        "pair_tokens_min_median_max": [min(lengths), sorted(lengths)[len(lengths) // 2], max(lengths)],
        "answer_tokens_min_median_max": [min(answers), sorted(answers)[len(answers) // 2], max(answers)],
        "longer_than_block": sum(n > args.block_size for n in lengths),
    }
    return result


def memory_arm(args: argparse.Namespace) -> dict[str, Any]:
    """One DPO fine-tuning run in this process (--memory-arm precomputed | two_models): its peak RSS."""
    import torch

    from supertune.train.preference.preference_losses import LOSSES, PairLogps
    from supertune.train.preference.preference_reference import attach_reference
    from supertune.train.preference.preference_scoring import batch_logps
    from supertune.training_data.preference_data import PackedPreferenceCollator, PreferenceCollator

    tokenizer = _tokenizer()
    rows = _rows(tokenizer, args.memory_pairs * args.memory_steps, args.seed + 1)
    collator = PackedPreferenceCollator(tokenizer.pad_token_id, args.block_size)
    before = _status_kb("VmRSS")
    hidden = args.memory_hidden
    model = _model(
        tokenizer,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=args.memory_layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
    )
    parameters = sum(p.numel() for p in model.parameters())
    reference = None
    if args.memory_arm == "precomputed":
        attach_reference(
            model, [rows], PreferenceCollator(tokenizer.pad_token_id), args.memory_pairs, torch.device("cpu")
        )
    else:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    dpo = LOSSES["dpo"]
    from supertune.config.schema import TrainingConfig

    t = TrainingConfig(objective="dpo")
    for step in range(args.memory_steps):
        batch = collator([rows[i] for i in range(step * args.memory_pairs, (step + 1) * args.memory_pairs)])
        logps, tokens = batch_logps(model, batch)
        if reference is None:
            ref = batch["ref_logps"]
        else:
            with torch.no_grad():
                ref = batch_logps(reference, batch)[0]
        b = logps.shape[0] // 2
        pairs = PairLogps(logps[:b], logps[b:], tokens[:b], tokens[b:], ref[:b], ref[b:])
        dpo(pairs, t).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = _status_kb("VmHWM")
    return {"arm": args.memory_arm, "parameters": parameters, "rss_before_model_kb": before, "peak_rss_kb": peak}


def _status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in kB. Not getrusage's ru_maxrss: a
    process started by fork and exec keeps there the peak of the parent it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ("precomputed", "two_models"):
        command = [sys.executable, __file__, "--memory-arm", arm, *_passed(args)]
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
        out[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
    p, two = out["precomputed"], out["two_models"]
    out["ratio_peak"] = p["peak_rss_kb"] / two["peak_rss_kb"]
    out["ratio_above_start"] = (p["peak_rss_kb"] - p["rss_before_model_kb"]) / (
        two["peak_rss_kb"] - two["rss_before_model_kb"]
    )
    return out


def _passed(args: argparse.Namespace) -> list[str]:
    keys = ("threads", "seed", "block_size", "memory_hidden", "memory_layers", "memory_steps", "memory_pairs")
    return [x for k in keys for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


def markdown(result: dict[str, Any], command: str) -> str:
    t, m = result["throughput"], result["memory"]
    p = t["pairs"]
    mb = 1024.0
    lines = [
        "# Preference tuning: packed DPO against a padded batch, precomputed reference against two models",
        "",
        f"{result['when']}, {result['machine']}, torch {result['versions']['torch']}, transformers "
        f"{result['versions']['transformers']}, {result['threads']} torch thread(s). See bench/README.md.",
        "",
        "```",
        command,
        "```",
        "",
        f"Pairs: {p['count']} from wikitext-2 paragraphs; a pair (prompt + chosen + prompt + rejected) "
        f"{p['pair_tokens_min_median_max'][0]} / {p['pair_tokens_min_median_max'][1]} / "
        f"{p['pair_tokens_min_median_max'][2]} tokens (min / median / max), an answer "
        f"{p['answer_tokens_min_median_max'][0]} / {p['answer_tokens_min_median_max'][1]} / "
        f"{p['answer_tokens_min_median_max'][2]}; {p['longer_than_block']} pair(s) longer than the block "
        f"({result['block_size']}): each batch holding one has rows as long as it.",
        "",
        "## Effective tokens/s: the same pairs, the same steps, in turns in one process",
        "",
        f"The embedded tiny Llama, SDPA, float32, DPO (sigmoid, beta 0.1) with the reference precomputed, "
        f"{result['pairs_per_step']} pairs a step, {result['steps']} AdamW steps per arm (the first of each left out).",
        "",
        "| arm | effective tok/s | all slots tok/s | padding | median step (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (("a", "(a) supertune, packed pairs"), ("b", "(b) padded batch (TRL's default collator)")):
        r = t[name]
        lines.append(
            f"| {label} | {r['effective_tokens_per_s']:,.0f} | {r['slots_per_s']:,.0f} | "
            f"{100 * r['padding_share']:.1f} % | {r['median_step_s']:.3f} |"
        )
    goal = TARGETS["a/b effective tokens/s"]
    lines += [
        "",
        f"- a/b effective tokens/s: **{t['ratio']:.2f}x** (goal >= {goal}x: {'met' if t['ratio'] >= goal else 'not met'})",
        f"- the two arms' losses, step by step: largest difference {t['loss_difference']:.1e} (the same pairs, the same model)",
        "",
        "## Peak memory: a full fine-tuning DPO step, the reference precomputed against a second model",
        "",
        f"A Llama of {m['precomputed']['parameters'] / 1e6:.1f} M parameters (float32, AdamW), "
        f"{result['memory_pairs']} pairs a step, {result['memory_steps']} steps, packed batches, each arm in a fresh process. "
        "Peak RSS (VmHWM of /proc/self/status).",
        "",
        "| arm | peak RSS (MB) | above the RSS before the model (MB) |",
        "| --- | ---: | ---: |",
    ]
    for name, label in (
        ("precomputed", "reference precomputed (one model)"),
        ("two_models", "a second model as the reference"),
    ):
        r = m[name]
        lines.append(
            f"| {label} | {r['peak_rss_kb'] / mb:,.0f} | {(r['peak_rss_kb'] - r['rss_before_model_kb']) / mb:,.0f} |"
        )
    goal = TARGETS["precomputed/two models peak memory"]
    met = "met" if m["ratio_above_start"] <= goal else "not met"
    lines += [
        "",
        f"- precomputed / two models, peak RSS: **{m['ratio_peak']:.2f}x**; above the RSS before the model: "
        f"**{m['ratio_above_start']:.2f}x** (goal <= {goal}x: {met})",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: 2 shared cores)")
    ap.add_argument("--steps", type=int, default=8, help="DPO steps per arm in the tokens/s part")
    ap.add_argument("--pairs-per-step", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=1024, help="tokens per packed row (data.block_size)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-hidden", type=int, default=384, help="hidden size of the memory part's Llama")
    ap.add_argument("--memory-layers", type=int, default=8)
    ap.add_argument("--memory-steps", type=int, default=2)
    ap.add_argument("--memory-pairs", type=int, default=2, help="pairs a step in the memory part")
    ap.add_argument("--memory-arm", choices=("precomputed", "two_models"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "preference")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.memory_arm:
        print(json.dumps(memory_arm(args)))
        return
    import transformers

    command = " ".join([".venv/bin/python bench/preference.py", *sys.argv[1:]])
    result = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPU cores",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "threads": args.threads,
        "steps": args.steps,
        "pairs_per_step": args.pairs_per_step,
        "block_size": args.block_size,
        "memory_pairs": args.memory_pairs,
        "memory_steps": args.memory_steps,
        "throughput": throughput(args),
        "memory": memory(args),
        "command": command,
    }
    text = markdown(result, command)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
