"""Preference runs end to end through `supertune train`: TRL's metrics in metrics.jsonl and the
summary, a run killed after the reference was computed (after a checkpoint, or before the first)
starts again to the same losses, reading the reference log-probabilities back from the run instead of
computing them again, KTO with LoRA
(the reference the base with the adapter off), DPO learning the pairs it trains on, and DPO on the
embedded pairs preferring the answers that agree with the facts (held-out preference accuracy >= 0.9)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_resume import losses, train

pytestmark = pytest.mark.slow

SMALL = [
    "data.max_train_samples=32",
    "data.max_eval_samples=16",
    "model.config_overrides=num_hidden_layers=1",
    "training.max_steps=4",
    "training.save_steps=2",
    "training.report_to=[]",
]
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def dpo(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dpo") / "run"
    proc = train(run, "training.objective=dpo", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reference log-probabilities of 32 and 16 rows computed once with the start model" in proc.stderr
    return run


def test_a_dpo_run_logs_trls_metrics(dpo):
    steps = [r for r in _records(dpo) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for record in steps:
        assert set(METRICS) <= set(record), record
        assert abs(record["rewards/margins"] - (record["rewards/chosen"] - record["rewards/rejected"])) < 1e-6
    assert steps[0]["loss"] == pytest.approx(0.6931, abs=1e-4)  # log 2: at the start the policy is the reference
    summary = _summary(dpo)
    assert {f"eval_{m}" for m in METRICS} <= set(summary)
    assert summary["perplexity"] is None and summary["eval_loss"] > 0
    # The answers of the pairs read: 4 steps of 8 pairs, each pair's two answers.
    assert 0 < summary["train_loss_tokens"] < summary["train_tokens"]


def test_a_dpo_run_killed_resumes_to_the_same_losses(dpo, tmp_path):
    run = tmp_path / "run"
    killed = train(run, "training.objective=dpo", *SMALL, fault="step@3")
    assert killed.returncode != 0
    assert "computed once with the start model" in killed.stderr
    resumed = train(run, "training.objective=dpo", *SMALL)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from checkpoint-2" in resumed.stdout + resumed.stderr
    # The reference log-probabilities the killed start wrote into the run are read back, not computed again.
    assert f"reference log-probabilities of 32 and 16 rows read from {run / 'reference'}" in resumed.stderr
    assert "computed once" not in resumed.stderr
    straight, again = losses(dpo), losses(run)
    assert again.keys() == straight.keys()
    for step, loss in straight.items():
        assert again[step] == pytest.approx(loss, abs=1e-6), step


def test_a_dpo_run_killed_before_its_first_checkpoint_reads_its_reference_back(dpo, tmp_path):
    """Killed after the precompute and one step, with no checkpoint yet: the next start trains from
    the start again, on the stored reference log-probabilities, to the uninterrupted run's losses."""
    run = tmp_path / "run"
    killed = train(run, "training.objective=dpo", *SMALL, fault="step@1")
    assert killed.returncode != 0 and not (run / "checkpoints" / "latest").exists()
    assert (run / "reference" / "reference.json").exists()
    again = train(run, "training.objective=dpo", *SMALL)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "read from" in again.stderr and "computed once" not in again.stderr
    assert losses(run) == pytest.approx(losses(dpo), abs=1e-6)


def test_kto_with_lora_takes_the_base_as_its_reference(tmp_path):
    run = tmp_path / "run"
    proc = train(run, "training.objective=kto", "model.lora.enabled=true", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reference log-probabilities" not in proc.stderr  # no precompute: the adapter is switched off instead
    steps = [r for r in _records(run) if "loss" in r]
    assert all("kl" in r and r["kl"] >= 0 for r in steps)
    assert any("rewards/chosen" in r for r in steps) and any("rewards/rejected" in r for r in steps)
    assert "eval_kl" in _summary(run)


def test_dpo_learns_to_prefer_the_chosen_answers_it_trains_on(tmp_path):
    """32 embedded pairs, 20 epochs of them: the training pairs' rewards/accuracies ends near 1, the
    margin grows."""
    run = tmp_path / "run"
    proc = train(
        run,
        "training.objective=dpo",
        *SMALL,
        "training.max_steps=40",
        "training.learning_rate=3e-3",
        "training.logging_steps=10",
        "training.save_steps=1000",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [r for r in _records(run) if "loss" in r]
    assert steps[-1]["rewards/accuracies"] >= 0.9, steps
    assert steps[-1]["rewards/margins"] > steps[0]["rewards/margins"] and steps[-1]["loss"] < 0.5


def test_dpo_on_the_embedded_pairs_prefers_the_answers_that_agree_with_the_facts(tmp_path):
    """`supertune train training.objective=dpo` with no data files, from fresh weights at the default
    seed, with the steps and learning rate the embedded pairs take (400 at 3e-3, the resolver's rule
    for them): 200 held-out pairs. The pairs ask for a copy of a word from the prompt, which the model
    learns late and then at once (measured: 0.68 at step 100, 0.89 at 200, 0.955 at 300 and at 400
    evaluated every 100 steps), evaluated once, at the end."""
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run), "training.objective=dpo"]
    # output only: no tracker, no sample
    proc = subprocess.run([*argv, "training.report_to=[]", "generate.max_new_tokens=0"], capture_output=True,
                          text=True, timeout=1500)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(run)
    assert summary["train_steps"] == 400, summary
    assert summary["eval_rewards/accuracies"] >= 0.9, summary
    assert summary["eval_rewards/margins"] > 0
