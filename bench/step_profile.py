"""Where a training step's time goes: supertune (a) against the run_clm-style recipe (c), part by part.

    .venv/bin/python bench/step_profile.py [--rounds 2] [--steps 14] [--profiled 4] [--threads 1]

Both arms train the same tiny Llama on batches of the same shape (8 x 512 tokens, packed, no
padding) with the same optimizer settings, as in bench/train_throughput.py, each in its own cold
process, the arms alternating. bench/throughput/step_costs.py wraps the Trainer's parts of a step
and every callback hook and times each by the wall clock and by the thread's CPU clock; the last
--profiled steps run under cProfile for the costliest functions. Steps 2 .. steps-profiled give the
per-part medians (step 1 pays for warm-up). Writes bench/results/step_profile.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from throughput.instrumented import run_instrumented
from throughput.prepare import prepare
from throughput.settings import BenchSettings
from throughput.step_costs import STEP

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MODES = (("supertune", "a"), ("clm", "c"))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "wikitext-2")
    p.add_argument("--work-dir", type=Path, default=BENCH / "work")
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--rounds", type=int, default=2, help="cold runs per arm, alternating")
    p.add_argument("--steps", type=int, default=14, help="optimizer steps per run")
    p.add_argument("--profiled", type=int, default=4, help="last steps of each run under cProfile")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--quiet-wait", type=float, default=15.0, help="seconds to wait at most for idle cores")
    return p.parse_args()


# A subclass's override of a Trainer method, timed whole, and the Trainer's own part inside it.
OVERRIDES = {
    "training_step": "forward + backward (Trainer.training_step)",
    "_get_grad_norm": "gradient norm to the host (Trainer)",
}
WHOLE = " (whole, the Trainer's part included)"


def per_step(runs: list[dict], last_timed: int) -> dict[str, tuple[float, float, float]]:
    """Median over the timed steps of all runs of each part's (wall ms, CPU ms, calls) per step; a part
    absent from a step counts as 0 there. An override's row is its own work: its whole time less the
    Trainer method's inside it, step by step."""
    steps = [run["steps"].get(str(s), {}) for run in runs for s in range(2, last_timed + 1)]
    for parts in steps:
        for name in [n for n in parts if n.endswith(WHOLE)]:
            whole = parts.pop(name)
            base = parts.get(OVERRIDES[name.removesuffix(WHOLE).rsplit(".", 1)[1]], [0.0, 0.0, 0])
            own = f"{name.removesuffix(WHOLE)}: the override's own work"
            parts[own] = [whole[0] - base[0], whole[1] - base[1], whole[2]]
    names = {n for parts in steps for n in parts}
    out = {}
    for name in names:
        values = [parts.get(name, [0.0, 0.0, 0]) for parts in steps]
        out[name] = (
            1e3 * statistics.median(v[0] for v in values),
            1e3 * statistics.median(v[1] for v in values),
            statistics.median(v[2] for v in values),
        )
    return out


def own_work(a: dict, c: dict) -> tuple[float, list[str]]:
    """CPU ms per step of what only supertune runs: its callbacks and overrides (the parts (c) lacks)."""
    names = [n for n in a if n not in c and (n.startswith("callback ") or "override" in n)]
    return sum(a[n][1] for n in names), sorted(names)


def top_functions(runs: list[dict], profiled: int, own: str | None = None, count: int = 12) -> list[tuple[str, float]]:
    """The costliest functions by own CPU time per profiled step (median over runs)."""
    per: dict[str, list[float]] = {}
    for run in runs:
        for name, _calls, tottime, _cum in run["profile"]:
            if own is None or own in name:
                per.setdefault(name, []).append(1e3 * tottime / max(profiled, 1))
    rows = [(name, statistics.median(v + [0.0] * (len(runs) - len(v)))) for name, v in per.items()]
    return sorted(rows, key=lambda r: -r[1])[:count]


def table(a: dict, c: dict) -> list[str]:
    lines = [
        "| part of an optimizer step | (a) supertune wall ms | (a) CPU ms | (c) run_clm-style wall ms | (c) CPU ms | a - c CPU ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = sorted(set(a) | set(c), key=lambda n: (n != STEP, not n.startswith(("data", "forward", "optimizer")), n))
    for name in names:
        aw, ac, _ = a.get(name, (0.0, 0.0, 0))
        cw, cc, _ = c.get(name, (0.0, 0.0, 0))
        label = f"**{name}**" if name == STEP else name
        lines.append(f"| {label} | {aw:,.2f} | {ac:,.2f} | {cw:,.2f} | {cc:,.2f} | {ac - cc:+,.2f} |")
    return lines


def main() -> int:
    args = parse_args()
    if args.steps - args.profiled < 3:
        raise SystemExit("step_profile: --steps must exceed --profiled by 3 or more (steps 2.. are timed)")
    settings = BenchSettings(threads=args.threads, steps=args.steps + 2)
    prepared = prepare(args.data_dir.resolve(), args.work_dir.resolve(), settings)
    root = args.work_dir.resolve() / "step_profile" / time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, list[dict]] = {m: [] for m, _ in MODES}
    loads: dict[str, list[float]] = {m: [] for m, _ in MODES}
    started = time.time()
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode, key in order:
            record, other = run_instrumented(
                "step_profile",
                "step_costs",
                mode,
                key,
                prepared,
                settings,
                root / f"{mode}-{r + 1}",
                args.quiet_wait,
                (str(args.steps), str(args.profiled)),
            )
            runs[mode].append(record)
            if other is not None:
                loads[mode].append(other)
            print(f"step_profile: round {r + 1}: {mode} done", flush=True)
    last_timed = args.steps - args.profiled
    parts = {mode: per_step(runs[mode], last_timed) for mode, _ in MODES}
    a, c = parts["supertune"], parts["clm"]
    step_a, step_c = a[STEP], c[STEP]
    own_ms, _ = own_work(a, c)
    command = "python bench/step_profile.py " + " ".join(sys.argv[1:])
    md = [
        "# Where a training step goes: supertune vs the run_clm-style Trainer",
        "",
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}, {args.rounds} cold run(s) per arm, "
        f"{args.threads} torch thread(s), batch {settings.batch_size} x {settings.seq_len} tokens, tiny Llama; "
        f"medians over steps 2-{last_timed} of every run. Other processes kept "
        + ", ".join(f"{m}: {statistics.median(v):.2f}" for m, v in loads.items() if v)
        + " cores busy meanwhile (2 in all).",
        "",
        "```",
        command,
        "```",
        "",
        *table(a, c),
        "",
        f"- a/c tokens/s from the whole step's time, wall clock: {step_c[0] / step_a[0]:.3f}x; thread CPU clock: "
        f"{step_c[1] / step_a[1]:.3f}x (whole step: a {step_a[1]:,.1f} CPU ms, c {step_c[1]:,.1f} CPU ms)",
        f"- supertune's own per-step work (its callbacks and overrides, the rows (c) lacks): {own_ms:.2f} CPU ms "
        f"a step, {100 * own_ms / step_a[1]:.3f} % of the step",
        "- A part's CPU time is its own thread's; with one torch thread that is the arithmetic too. The whole step's "
        "row is not the sum of the rows under it: callbacks run inside the bookkeeping row, the subclass's override "
        "rows contain the Trainer's, and what is not wrapped (zero_grad, the scheduler, the loop itself) is only in the "
        "whole.",
        "",
    ]
    for mode, key in MODES:
        md += [
            f"## Costliest functions of ({key}) {mode}, own CPU ms per step (cProfile, last {args.profiled} steps)",
            "",
        ]
        md += ["| function | ms per step |", "| --- | ---: |"]
        md += [f"| `{name}` | {ms:,.3f} |" for name, ms in top_functions(runs[mode], args.profiled)]
        md.append("")
    md += ["## supertune's own functions in the profiled steps (own CPU ms per step)", ""]
    md += ["| function | ms per step |", "| --- | ---: |"]
    md += [f"| `{n}` | {ms:,.4f} |" for n, ms in top_functions(runs["supertune"], args.profiled, "supertune/", 15)]
    md.append("")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "step_profile.md").write_text("\n".join(md), encoding="utf-8")
    (args.results_dir / "step_profile.json").write_text(
        json.dumps(
            {
                "command": command,
                "wall_time_s": round(time.time() - started, 1),
                "settings": settings.as_dict(),
                "per_step_ms": {m: {n: list(v) for n, v in p.items()} for m, p in parts.items()},
                "other_cores": loads,
                # The costliest functions (own CPU ms per profiled step), not every step of every run.
                "profile": {mode: top_functions(runs[mode], args.profiled, None, 60) for mode, _ in MODES},
                "supertune_functions": top_functions(runs["supertune"], args.profiled, "supertune/", 60),
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    print("\n".join(md))
    print(f"step_profile: wrote {args.results_dir / 'step_profile.md'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
