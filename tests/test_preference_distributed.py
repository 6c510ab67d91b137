"""DPO (and KTO) on two processes (real torchrun, gloo, CPU) equal the run on one process, step by step.

The same 4 steps of the same global batch of 8 pairs (training.global_batch_size: 8 pairs on one
process, 4 on each of two): the logged loss and TRL's metrics of every step, and the final
evaluation, equal to 1e-5: DPO under DDP and under FSDP (full sharding), KTO under FSDP. One
single-process run of an objective serves every comparison with it; every process pays some seconds
of imports, so the runs are kept short (the embedded model with one layer, 32 training rows).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TOLERANCE = 1e-5
RUN = [
    "data.max_train_samples=32",
    "data.max_eval_samples=16",
    "model.config_overrides=num_hidden_layers=1",
    "training.max_steps=4",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "training.global_batch_size=8",
    "training.per_device_train_batch_size=8",
    "generate.max_new_tokens=0",
]
COMPARED = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected", "kl")
# rewards/accuracies is left out: it counts the signs of the margins, and at the first step the policy
# is the reference, so every margin is 0 up to float rounding (1e-9) and its sign is noise.


def _train(run: Path, nproc: int, *extra: str) -> tuple[dict[int, dict], dict]:
    """(step -> its logged record, summary.json) of `supertune train --nproc N` with RUN and `extra`."""
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run), "--nproc", str(nproc), *RUN, *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "loss" in r}
    return steps, json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Callable[[str], tuple[dict[int, dict], dict]]:
    """The single-process run of an objective, trained once for every comparison with it."""
    runs: dict[str, tuple[dict[int, dict], dict]] = {}

    def run(objective: str) -> tuple[dict[int, dict], dict]:
        if objective not in runs:
            runs[objective] = _train(tmp_path_factory.mktemp(objective) / "run", 1, f"training.objective={objective}")
        return runs[objective]

    return run


@pytest.mark.slow
@pytest.mark.parametrize(("objective", "strategy"), [("dpo", "ddp"), ("dpo", "fsdp"), ("kto", "fsdp")])
def test_two_processes_equal_one_process_per_step(one_process, tmp_path, objective, strategy):
    """KTO under FSDP too: its KL estimate is a mean over both processes' rows, and its KL rows are
    scored without gradients by the sharded model, every process together."""
    one_steps, one_summary = one_process(objective)
    steps, summary = _train(tmp_path / "run", 2, f"training.objective={objective}", f"distributed.strategy={strategy}")
    assert sorted(steps) == sorted(one_steps) == [1, 2, 3, 4]
    assert summary["world_size"] == 2 and one_summary["world_size"] == 1
    names = [name for name in COMPARED if name in one_steps[1]]
    assert "loss" in names and (objective != "kto" or "kl" in names)
    worst = {
        name: max(abs(steps[s][name] - one_steps[s][name]) for s in steps if name in one_steps[s]) for name in names
    }  # the loss of each step, then the metrics averaged over its pairs (rows)
    print(f"{objective} under {strategy} against one process, the largest difference of a step: {worst}")
    assert all(diff <= TOLERANCE for diff in worst.values()), worst
    assert abs(summary["eval_loss"] - one_summary["eval_loss"]) <= TOLERANCE
    assert abs(summary["eval_rewards/margins"] - one_summary["eval_rewards/margins"]) <= TOLERANCE
    assert summary["train_tokens"] == one_summary["train_tokens"]  # the same rows, split over the processes
    if strategy == "fsdp":
        assert summary["sharding"]["strategy"] == "fsdp" and summary["sharding"]["wrapper"].startswith("FSDP")


def test_deepspeed_is_refused_for_a_preference_objective_in_one_line():
    from supertune.config.errors import ConfigError
    from supertune.resolve import resolve_run_config

    resolve_run_config(None, ["training.objective=dpo", "distributed.strategy=fsdp", "launch.nproc=2"])
    with pytest.raises(ConfigError) as info:
        resolve_run_config(None, ["training.objective=dpo", "distributed.strategy=zero2", "launch.nproc=2"])
    assert (
        "distributed.strategy: training.objective=dpo runs under ddp or fsdp only for now (got zero2); "
        "choose one of those"
    ) in str(info.value).splitlines()
