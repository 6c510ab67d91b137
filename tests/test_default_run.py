"""The embedded default run, end to end through the real CLI, and what it leaves behind."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("default") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_default_run_reports_and_saves(default_run):
    run_dir, proc = default_run
    out = proc.stdout
    assert "supertune: eval loss" in out and "perplexity" in out
    assert "supertune: sample: 'Once there was a town called" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in (
        "eval_loss",
        "perplexity",
        "train_tokens",
        "train_runtime_s",
        "tokens_per_second",
        "unigram_perplexity",
    ):
        assert key in summary
    assert summary["train_tokens"] > 0 and summary["tokens_per_second"] > 0
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (run_dir / "model" / name).is_file(), name
    assert (run_dir / "config.yaml").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run_dir / "checkpoints").glob("checkpoint-*"))
    # Not a terminal (output captured, as in a job log): progress lines instead of a bar
    assert "\r" not in proc.stdout + proc.stderr
    assert re.search(
        r"supertune: progress: step (\d+)/\1 \(100%\), loss [0-9.]+, [0-9,]+ tokens/s", proc.stdout + proc.stderr
    )


def test_loss_falls(default_run):
    run_dir, _ = default_run
    losses = _losses(run_dir)
    assert len(losses) >= 5
    first, last = losses[0][1], losses[-1][1]
    assert last < first * 0.6, losses


def test_perplexity_clearly_beats_the_unigram_baseline(default_run):
    run_dir, _ = default_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert math.isclose(summary["perplexity"], math.exp(summary["eval_loss"]), rel_tol=1e-9)
    assert summary["perplexity"] < 0.6 * summary["unigram_perplexity"], summary


RELOAD = textwrap.dedent(
    """
    import json, sys, torch, yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer
    run_dir = sys.argv[1]
    cfg = yaml.safe_load(open(run_dir + "/config.yaml"))
    block = cfg["data"]["block_size"]
    tok = AutoTokenizer.from_pretrained(run_dir + "/model")
    model = AutoModelForCausalLM.from_pretrained(run_dir + "/model").eval()
    ids = []
    for line in open(sys.argv[2]):
        ids += tok(json.loads(line)["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(ids) // block
    blocks = torch.tensor(ids[: n * block]).view(n, block)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, n, 16):
            x = blocks[start : start + 16]
            logits = model(input_ids=x).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += x[:, 1:].numel()
    print(json.dumps({"loss": total / count, "supertune": "supertune" in sys.modules}))
    """
)


def test_saved_model_reloads_with_plain_transformers_and_same_eval_loss(default_run):
    from supertune.embedded import default_corpus

    run_dir, _ = default_run
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, str(run_dir), str(default_corpus().validation)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["supertune"] is False
    summary = json.loads((run_dir / "summary.json").read_text())
    assert abs(result["loss"] - summary["eval_loss"]) <= 1e-5, (result, summary["eval_loss"])


def test_eval_command_matches_the_run(default_run):
    run_dir, _ = default_run
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "eval", str(run_dir / "model")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = float(proc.stdout.split("eval loss ")[1].split()[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert abs(loss - summary["eval_loss"]) <= 1e-5


def test_generate_command_continues_the_prompt(default_run):
    run_dir, _ = default_run
    cmd = [
        sys.executable,
        "-m",
        "supertune",
        "generate",
        str(run_dir / "model"),
        "--prompt",
        "The river",
        "--max-new-tokens",
        "20",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith("The river")
    assert len(first.stdout.split()) > 4
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.stdout == first.stdout  # seeded sampling
