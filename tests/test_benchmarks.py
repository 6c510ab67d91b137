"""Downstream benchmarks with lm-evaluation-harness, run for real on the embedded offline task.

One training of the embedded default (120 steps) with evaluation.tasks and every_steps and MLflow;
then `supertune eval --tasks` on its model, and the refusals (an unknown task, a task whose data is
not in the local cache). The federation's benchmarks per round are tested in test_federation.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHANCE = 0.25  # four choices per question


def _supertune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supertune", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("benchmarks") / "run"
    proc = _supertune(
        "train", "--run-dir", str(run_dir), "evaluation.tasks=[supertune_corpus]", "evaluation.every_steps=60",
        "training.report_to=[mlflow]", "generate.max_new_tokens=0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "benchmarks.jsonl").read_text().splitlines()]


def test_a_trained_model_beats_chance_on_the_embedded_task(trained: Path) -> None:
    """Measured over seeds 1-3 of this run: the group 0.44-0.52 (nouns 0.88, verbs 0.27-0.42, facts
    0.17-0.25), an untrained model 0.21."""
    scores = json.loads((trained / "summary.json").read_text())["benchmarks"]
    assert set(scores) == {"supertune_corpus", *(f"supertune_corpus_{k}" for k in ("verbs", "nouns", "facts"))}
    assert scores["supertune_corpus"]["acc"] > CHANCE + 0.10, scores
    assert scores["supertune_corpus_nouns"]["acc"] > 0.6, scores


def test_scores_go_to_the_run_dir_metrics_and_mlflow(trained: Path) -> None:
    records = _records(trained)
    assert [(r["step"], r["model"]) for r in records] == [(60, "training"), (120, "trained")]
    final = records[-1]["scores"]
    table = (trained / "benchmarks.md").read_text()
    assert "| when | model | supertune_corpus acc |" in table.splitlines()[0]
    assert f"| step 120 | `trained` | {final['supertune_corpus']['acc']:.4f} |" in table
    metrics = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    logged = [(m["step"], m["bench/supertune_corpus/acc"]) for m in metrics if "bench/supertune_corpus/acc" in m]
    assert logged == [(r["step"], r["scores"]["supertune_corpus"]["acc"]) for r in records]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{trained / 'mlflow' / 'mlflow.db'}")
    run_id = json.loads((trained / "tracking.json").read_text())["mlflow_run_id"]
    history = client.get_metric_history(run_id, "bench/supertune_corpus/acc")
    assert sorted((m.step, m.value) for m in history) == logged


def test_eval_tasks_on_a_runs_model_appends_to_its_run(trained: Path, capfd) -> None:
    from supertune.cli.main import main

    capfd.readouterr()  # the command's code, in this process
    code = main(["eval", str(trained / "model"), "--tasks", "supertune_corpus_nouns", "--limit", "16"])
    out = capfd.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    last = _records(trained)[-1]
    assert last["step"] == 120 and last["model"] == str(trained / "model")
    assert set(last["scores"]) == {"supertune_corpus_nouns"}
    assert f"{last['scores']['supertune_corpus_nouns']['acc']:.4f}" in out.out
    assert f"scores recorded in {trained / 'benchmarks.md'}" in out.out
    # and into the run's tracked run (training.report_to=[mlflow]), at the run's last step
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{trained / 'mlflow' / 'mlflow.db'}")
    run_id = json.loads((trained / "tracking.json").read_text())["mlflow_run_id"]
    history = client.get_metric_history(run_id, "bench/supertune_corpus_nouns/acc")
    logged = [(m.step, m.value) for m in sorted(history, key=lambda m: m.timestamp)]
    # steps 60 and 120 from training (the group's subtask), then this evaluation's
    assert len(logged) == 3 and logged[-1] == (120, last["scores"]["supertune_corpus_nouns"]["acc"]), logged


def test_an_unknown_task_and_missing_data_are_one_line_each(trained: Path, tmp_path: Path, capfd) -> None:
    from supertune.cli.main import main

    absent = tmp_path / "absent.yaml"
    absent.write_text(
        "task: absent_mc\ndataset_path: supertune-tests/absent\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\nmetric_list: [{metric: acc}]\n",
        encoding="utf-8",
    )
    before = (trained / "benchmarks.jsonl").read_text()
    for tasks, expected in (
        ("supertune_corpus,no_such_task", "--tasks: unknown task no_such_task: name a task or group"),
        (str(absent), f"--tasks: the data of task {absent} (dataset supertune-tests/absent) is not in the local"),
    ):
        capfd.readouterr()
        code = main(["eval", str(trained / "model"), "--tasks", tasks])  # the command's code, in this process
        err = capfd.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and lines[-1].startswith(f"supertune: error: {expected}"), err[-2000:]
        assert "Traceback" not in err
    assert "pre-download it" in lines[-1] and "datasets.load_dataset('supertune-tests/absent')" in lines[-1]
    assert (trained / "benchmarks.jsonl").read_text() == before  # nothing recorded for a refused evaluation


def test_a_global_model_without_a_tokenizer_is_scored_with_the_sites_tokenizer(tmp_path: Path, capfd) -> None:
    """A federation's global model saved without a tokenizer (a base model given without one, as the
    two-site Llama recipe's) is scored with the sites' model.tokenizer; with none named, refused in one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from supertune.cli.main import main
    from supertune.config import dump_config
    from supertune.embedded.model import default_model_config
    from supertune.embedded.tokenizer import default_tokenizer
    from supertune.resolve import resolve_run_config

    tokenizer_dir = default_tokenizer()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    fed = tmp_path / "fed"
    model = fed / "round-001" / "global"
    config = default_model_config(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    AutoModelForCausalLM.from_config(LlamaConfig(**{**config, "num_hidden_layers": 1})).save_pretrained(model)
    (fed / "federation.yaml").write_text("rounds: 1\n", encoding="utf-8")
    (fed / "sites").mkdir()
    site = resolve_run_config(None, [f"model.tokenizer={tokenizer_dir}"], trains=False)
    (fed / "sites" / "a.yaml").write_text(dump_config(site), encoding="utf-8")
    args = ["eval", str(model), "--tasks", "supertune_corpus_nouns", "--limit", "4"]
    assert main(args) == 0
    (record,) = _records(fed)
    assert record["round"] == 1 and set(record["scores"]) == {"supertune_corpus_nouns"}
    capfd.readouterr()
    (fed / "sites" / "a.yaml").write_text(dump_config(resolve_run_config(None, [], trains=False)), encoding="utf-8")
    assert main(args) == 2
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"supertune: error: MODEL: {str(model)!r} holds no tokenizer"), line


SMALL = [
    "training.max_steps=4", "model.config_overrides=num_hidden_layers=1", "generate.max_new_tokens=0",
    "data.max_eval_samples=8", "training.report_to=[]", "evaluation.tasks=[supertune_corpus_nouns]",
    "evaluation.limit=8", "training.per_device_train_batch_size=4",
]  # fmt: skip


def test_benchmarks_every_2_steps_of_a_lora_run_under_ddp(tmp_path: Path) -> None:
    """Every 2 steps of a LoRA run under DDP: only rank 0 scores (the base with the adapters, the
    PeftModel in memory) and writes; the other process waits in its next step, nothing hangs. (Under
    FSDP, which shards the parameters, the saved model is read back whole and scored: tests/test_fsdp.py,
    its shard_grad_op run.)"""
    run_dir = tmp_path / "run"
    overrides = ["evaluation.every_steps=2", "model.lora.enabled=true"]
    proc = _supertune("train", "--run-dir", str(run_dir), "--nproc", "2", *SMALL, *overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = _records(run_dir)
    assert [(r["step"], r["model"]) for r in records] == [(2, "training"), (4, "trained")]
    assert all(set(r["scores"]) == {"supertune_corpus_nouns"} for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["benchmarks"] == records[-1]["scores"]
    assert (run_dir / "model" / "adapter_config.json").is_file()
