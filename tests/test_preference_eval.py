"""`supertune eval` on preference data: the model of a DPO run reports the run's own final eval
metrics (summary.json: eval_loss, eval_rewards/accuracies, eval_rewards/margins, ...) to 1e-6, with
the reference rebuilt from the run's start model; data without the objective's columns, and a
reference model nobody named, are one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from supertune.cli.main import main
from supertune.train.preference import preference_eval
from test_preference_runs import SMALL
from test_resume import error_lines, train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dpo(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dpo") / "run"
    proc = train(run, "training.objective=dpo", "training.learning_rate=3e-3", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


def _evaluated(monkeypatch) -> list[dict]:
    """What evaluate_preference_model returns to the CLI, call by call."""
    seen: list[dict] = []
    original = preference_eval.evaluate_preference_model

    def recording(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(preference_eval, "evaluate_preference_model", recording)
    return seen


def test_eval_of_a_dpo_runs_model_equals_the_runs_final_eval(dpo, monkeypatch, capsys):
    seen = _evaluated(monkeypatch)
    assert main(["eval", str(dpo / "model")]) == 0
    summary = json.loads((dpo / "summary.json").read_text())
    (metrics,) = seen
    names = {k for k in summary if k.startswith("eval_") and k != "eval_tokens"}
    assert {"eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"} <= names
    assert names == {k for k in metrics if k.startswith("eval_")}
    for name in names:
        assert metrics[name] == pytest.approx(summary[name], abs=1e-6), name
    assert summary["eval_rewards/margins"] != 0  # the policy moved away from its reference
    out = capsys.readouterr().out
    assert f"eval loss {summary['eval_loss']:.6f} (training.objective=dpo)" in out
    assert f"preference accuracy (rewards/accuracies) {summary['eval_rewards/accuracies']:.6f}" in out
    assert f"mean margin (rewards/margins) {summary['eval_rewards/margins']:.6f}" in out
    assert "(16 pairs)" in out


def test_pairs_given_with_data_are_evaluated_whole(dpo, tmp_path, monkeypatch, capsys):
    """TRL's {prompt, chosen, rejected} rows from a file, plain text; orpo asked of the DPO run's model
    needs no reference."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"Where is the mill {i}?", "chosen": " North.", "rejected": " South."} for i in range(5)]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = _evaluated(monkeypatch)
    assert main(["eval", str(dpo / "model"), "--data", str(pairs), "training.objective=orpo"]) == 0
    assert seen[0]["rows"] == 5 and 0 <= seen[0]["eval_rewards/accuracies"] <= 1
    assert "eval_nll_loss" in seen[0] and "(5 pairs)" in capsys.readouterr().out


def test_bad_preference_input_is_one_line(dpo, tmp_path, capsys):
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "a b c"}\n{"text": "d e f"}\n')
    assert main(["eval", str(dpo / "model"), "--data", str(text)]) != 0
    (line,) = error_lines(capsys.readouterr().err)
    assert "data.chosen_field: column 'chosen' is not in the data (columns: text)" in line
    assert "training.objective=dpo reads {prompt, chosen, rejected} rows" in line
    copied = tmp_path / "copied"
    shutil.copytree(dpo / "model", copied)
    assert main(["eval", str(copied), "training.objective=kto"]) != 0
    (line,) = error_lines(capsys.readouterr().err)
    assert "model.name_or_path: training.objective=kto measures MODEL against the model its training" in line


def test_eval_of_a_kto_lora_runs_adapters_takes_the_base_as_reference(tmp_path, monkeypatch):
    """The run saved its adapters (and its fresh base); the reference is its start model with the
    adapter off, as its training took it."""
    run = tmp_path / "run"
    proc = train(run, "training.objective=kto", "model.lora.enabled=true", "training.learning_rate=3e-3", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run / "model" / "adapter_config.json").is_file()
    seen = _evaluated(monkeypatch)
    assert main(["eval", str(run / "model")]) == 0
    summary = json.loads((run / "summary.json").read_text())
    names = {k for k in summary if k.startswith("eval_") and k != "eval_tokens"}
    assert {"eval_loss", "eval_kl", "eval_rewards/margins"} <= names == {k for k in seen[0] if k.startswith("eval_")}
    for name in names:
        assert seen[0][name] == pytest.approx(summary[name], abs=1e-6), name
