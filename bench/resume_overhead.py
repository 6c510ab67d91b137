"""Resume overhead: time from process start to the first optimizer step, fresh start vs resume.

    .venv/bin/python bench/resume_overhead.py [--rounds R] [--steps N] [--kill-step K]

Per round, each in its own fresh process on the embedded default run:
  (a) fresh: `supertune train` in a new run directory (the baseline)
  (b) resume: the same run killed with SIGKILL after step K (SUPERTUNE_FAULT=step@K; checkpoints every
      K/2 steps), then the same command again: it checks the newest checkpoint (sizes and sha256),
      loads weights, optimizer, scheduler and RNG states, skips the consumed batches and trains on.
Both read `since_process_start_s` of the first_step event in metrics.jsonl. The ratio b/a and the
difference b-a (the resume overhead) go to stdout and bench/results/resume_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def train(run_dir: Path, steps: int, save_steps: int, fault: str | None = None) -> int:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("SUPERTUNE_FAULT", None)
    if fault:
        env["SUPERTUNE_FAULT"] = fault
    argv = [
        sys.executable,
        "-m",
        "supertune",
        "train",
        "--run-dir",
        str(run_dir),
        f"training.max_steps={steps}",
        f"training.save_steps={save_steps}",
        "training.logging_steps=1",
        "generate.max_new_tokens=0",
        "output.save_model=false",
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True).returncode


def first_steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("event") == "first_step"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--kill-step", type=int, default=16)
    args = ap.parse_args()
    fresh, resumed, checkpoint_mb = [], [], 0.0
    with tempfile.TemporaryDirectory(prefix="supertune-resume-bench-") as tmp:
        for r in range(args.rounds):
            a = Path(tmp) / f"fresh-{r}"
            assert train(a, args.steps, args.kill_step // 2) == 0, "fresh run failed"
            fresh.append(first_steps(a)[0]["since_process_start_s"])
            b = Path(tmp) / f"resume-{r}"
            assert train(b, args.steps, args.kill_step // 2, fault=f"step@{args.kill_step}") == -9, (
                "the kill did not happen"
            )
            newest = (b / "checkpoints" / "latest").read_text().strip()
            checkpoint_mb = sum(p.stat().st_size for p in (b / "checkpoints" / newest).rglob("*") if p.is_file()) / 1e6
            assert train(b, args.steps, args.kill_step // 2) == 0, "resumed run failed"
            event = first_steps(b)[-1]
            assert event["step"] > 1, event  # the first step after the newest checkpoint
            resumed.append(event["since_process_start_s"])
            print(f"round {r + 1}: fresh {fresh[-1]:.2f} s, resumed {resumed[-1]:.2f} s to the first step", flush=True)
    a_med, b_med = statistics.median(fresh), statistics.median(resumed)
    result = {
        "command": " ".join([Path(sys.executable).name, "bench/resume_overhead.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "checkpoint_mb": round(checkpoint_mb, 1),
        "fresh_s": fresh,
        "resumed_s": resumed,
        "median_fresh_s": a_med,
        "median_resumed_s": b_med,
        "ratio_b_over_a": b_med / a_med,
        "overhead_s": b_med - a_med,
    }
    print(
        f"b/a time to first step {result['ratio_b_over_a']:.2f}x; resume overhead {result['overhead_s']:+.2f} s "
        f"(medians of {args.rounds}: fresh {a_med:.2f} s, resumed {b_med:.2f} s; checkpoint {checkpoint_mb:.1f} MB)"
    )
    out = BENCH / "results"
    out.mkdir(exist_ok=True)
    (out / "resume_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "resume_overhead.md").write_text(
        "# Resume overhead\n\n"
        f"`{result['command']}` on {result['date']}, {result['cores']} cores, embedded default run, checkpoint {checkpoint_mb:.1f} MB.\n\n"
        "| arm | time from process start to first optimizer step (median) |\n| --- | --- |\n"
        f"| (a) fresh start | {a_med:.2f} s |\n| (b) resume after SIGKILL at step {args.kill_step} | {b_med:.2f} s |\n\n"
        f"b/a = {result['ratio_b_over_a']:.2f}x, overhead {result['overhead_s']:+.2f} s. Rounds: fresh {', '.join(f'{x:.2f}' for x in fresh)}; "
        f"resumed {', '.join(f'{x:.2f}' for x in resumed)}.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
