"""Training with data.document_mask on every data path: from files in memory, streamed, from a token
store, with two processes, and killed then resumed; the final evaluation is the documents' own loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from supertune.cli.main import main
from supertune.config.errors import ConfigError

WORDS = "river town alder miller bridge lantern orchard winter harbor stone quiet market".split()
BLOCK = 32

COMMON = [
    "data.document_mask=true",
    f"data.block_size={BLOCK}",
    "model.config_overrides=num_hidden_layers=1",
    "training.max_steps=4",
    "training.save_steps=2",
    "training.logging_steps=1",
    "training.per_device_train_batch_size=4",
    "training.per_device_eval_batch_size=8",
    "training.report_to=[]",
    "generate.max_new_tokens=0",
]


def _doc(i: int) -> str:
    """Stories of 9 to 60 words: some fill a fraction of a block, some are split into pieces."""
    words = [WORDS[(i * 5 + k * 7) % len(WORDS)] for k in range(8 + (i * 13) % 53)]
    return f"Story {i}: " + " ".join(words) + "."


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packing-data")
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps({"text": _doc(i)}) + "\n" for i in range(240)))
    valid = root / "valid.jsonl"
    valid.write_text("".join(json.dumps({"text": _doc(1000 + i)}) + "\n" for i in range(30)))
    return {"train": train, "valid": valid}


def _data(files: dict[str, Path]) -> list[str]:
    return [f"data.train_files={files['train']}", f"data.validation_files={files['valid']}"]


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "event" not in r}


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


def _subprocess_train(run: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_FAULT")}
    if fault:
        env["SUPERTUNE_FAULT"] = fault
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run), *COMMON, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def in_memory(files, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("in-memory") / "run"
    assert main(["train", "--run-dir", str(run), *COMMON, *_data(files)]) == 0
    return run


def _documents_alone_loss(model_dir: Path, texts: list[str]) -> tuple[float, int]:
    """Mean next-token loss of every validation document run alone, without padding; a document longer
    than the block is run as its block-sized pieces (what document masking trains on)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for lo in range(0, len(ids), BLOCK):
            piece = torch.tensor(ids[lo : lo + BLOCK])[None]
            if piece.shape[1] < 2:
                continue
            with torch.no_grad():
                logits = model(input_ids=piece).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits.double(), piece[0, 1:], reduction="sum").item()
            count += piece.shape[1] - 1
    return total / count, count


def test_in_memory_trains_and_its_evaluation_is_the_documents_own_loss(in_memory, files, capsys):
    summary = _summary(in_memory)
    assert summary["train_steps"] == 4
    texts = [json.loads(line)["text"] for line in files["valid"].read_text().splitlines()]
    loss, tokens = _documents_alone_loss(in_memory / "model", texts)
    assert summary["eval_tokens"] == tokens
    assert abs(summary["eval_loss"] - loss) <= 1e-5, (summary["eval_loss"], loss)
    # `supertune eval` of the saved model reuses the run's data settings and gives the same number
    capsys.readouterr()
    assert main(["eval", str(in_memory / "model")]) == 0
    printed = float(capsys.readouterr().out.split("eval loss")[1].split()[0])
    assert abs(printed - summary["eval_loss"]) <= 1e-5


def test_the_padding_is_logged(files, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="supertune"):
        assert (
            main(
                [
                    "train",
                    "--run-dir",
                    str(tmp_path / "run"),
                    *COMMON,
                    *_data(files),
                    "training.max_steps=1",
                    "training.save_strategy=no",
                    "output.save_model=false",
                ]
            )
            == 0
        )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("document mask: training split")]
    assert len(lines) == 1
    assert "240 documents" in lines[0] and "padding" in lines[0] and "longer than 32 tokens" in lines[0]


def test_from_a_store_the_losses_are_those_from_the_files(in_memory, files, tmp_path):
    store = tmp_path / "store"
    assert main(["prepare", "--out", str(store), *_data(files)]) == 0
    run = tmp_path / "stored"
    assert main(["train", "--run-dir", str(run), *COMMON, *_data(files), f"data.store={store}"]) == 0
    raw, stored = _losses(in_memory), _losses(run)
    assert sorted(raw) == sorted(stored) == [1, 2, 3, 4]
    assert max(abs(raw[s] - stored[s]) for s in raw) <= 1e-6
    assert abs(_summary(in_memory)["eval_loss"] - _summary(run)["eval_loss"]) <= 1e-6
    assert _summary(in_memory)["train_tokens"] == _summary(run)["train_tokens"]


def test_streaming_trains_and_reads_the_same_rows_every_time(files, tmp_path):
    from supertune.modeling.tokenizer import load_tokenizer
    from supertune.resolve import resolve_run_config
    from supertune.training_data.pipeline import build_training_data

    args = [*COMMON, *_data(files), "data.streaming=true"]
    cfg = resolve_run_config(None, args)
    tokenizer = load_tokenizer(cfg)
    first, second = (build_training_data(cfg.data, tokenizer, seed=7, context_length=1024) for _ in range(2))
    rows = [list(data.train) for data in (first, second)]
    assert len(rows[0]) > 60 and len(rows[0]) == len(rows[1])
    for a, b in zip(*rows):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels", "position_ids"))
    assert 0 <= first.padding_share < 0.5
    assert main(["train", "--run-dir", str(tmp_path / "run"), *args]) == 0
    assert _summary(tmp_path / "run")["train_steps"] == 4
    assert np.isfinite(list(_losses(tmp_path / "run").values())).all()


def test_document_mask_without_packing_is_refused(files, tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *COMMON, *_data(files), "data.packing=false"]) == 2
    err = capsys.readouterr().err
    assert "data.document_mask: needs data.packing=true" in err


def _tokenizer_override() -> str:
    """The model directories below hold a config alone: the tokenizer comes from elsewhere (validation refuses a model directory without one)."""
    from supertune.embedded import default_tokenizer

    return f"model.tokenizer={default_tokenizer()}"


def test_a_model_type_that_ignores_the_boundaries_is_refused(files, tmp_path, capsys):
    from transformers import OPTConfig

    model_dir = tmp_path / "opt"
    OPTConfig(
        vocab_size=2000,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        max_position_embeddings=64,
    ).save_pretrained(model_dir)
    args = [
        *COMMON,
        *_data(files),
        f"model.name_or_path={model_dir}",
        "model.from_config=true",
        "model.config_overrides={}",
        _tokenizer_override(),
    ]
    assert main(["train", "--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("supertune: error: data.document_mask: model type 'opt' is not verified"), err[-3:]


@pytest.mark.slow
def test_two_processes_follow_one_at_the_same_global_batch(in_memory, files, tmp_path):
    run = tmp_path / "two"
    proc = _subprocess_train(run, *_data(files), "--nproc", "2", "training.per_device_train_batch_size=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one, two = _losses(in_memory), _losses(run)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    assert max(abs(one[s] - two[s]) for s in one) <= 1e-4, (one, two)
    assert _summary(run)["world_size"] == 2
    assert _summary(run)["train_tokens"] == _summary(in_memory)["train_tokens"]
    assert abs(_summary(run)["eval_loss"] - _summary(in_memory)["eval_loss"]) <= 1e-4


@pytest.mark.slow
def test_killed_and_resumed_ends_with_the_uninterrupted_weights(in_memory, files, tmp_path):
    run = tmp_path / "run"
    killed = _subprocess_train(run, *_data(files), fault="step@3")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    resumed = _subprocess_train(run, *_data(files))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resuming from checkpoint-2" in resumed.stderr
    a, b = _weights(run), _weights(in_memory)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5
    ref, got = _losses(in_memory), _losses(run)
    assert max(abs(ref[s] - got[s]) for s in ref) <= 1e-5


@pytest.mark.slow
def test_streamed_run_killed_and_resumed_ends_with_the_uninterrupted_weights(files, tmp_path):
    stream = [*_data(files), "data.streaming=true"]
    straight = tmp_path / "straight"
    assert _subprocess_train(straight, *stream).returncode == 0
    run = tmp_path / "run"
    assert _subprocess_train(run, *stream, fault="step@3").returncode == -signal.SIGKILL
    resumed = _subprocess_train(run, *stream)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resuming from checkpoint-2" in resumed.stderr
    a, b = _weights(run), _weights(straight)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5


def test_the_model_check_before_a_run_reads_the_model_type_from_its_config(files, tmp_path):
    """What config resolution can ask before anything is loaded (supertune.modeling.model.document_mask_problems)."""
    from transformers import GPT2Config, OPTConfig

    from supertune.modeling.model import document_mask_problems
    from supertune.resolve import resolve_run_config

    OPTConfig(num_hidden_layers=1).save_pretrained(tmp_path / "opt")
    GPT2Config(n_layer=1).save_pretrained(tmp_path / "gpt2")

    def problems(*args: str) -> list[str]:
        cfg = resolve_run_config(None, [*_data(files), *args, _tokenizer_override()])
        return document_mask_problems(cfg.model, cfg.data)

    assert problems("data.document_mask=true") == []  # the embedded Llama
    assert (
        problems("data.document_mask=true", f"model.name_or_path={tmp_path / 'gpt2'}", "model.from_config=true") == []
    )
    # Config resolution itself refuses it, before anything is created.
    with pytest.raises(ConfigError) as refused:
        resolve_run_config(
            None,
            [
                *_data(files),
                "data.document_mask=true",
                f"model.name_or_path={tmp_path / 'opt'}",
                "model.from_config=true",
                _tokenizer_override(),
            ],
        )
    assert str(refused.value).startswith("data.document_mask: model type 'opt' is not verified")
    assert problems(f"model.name_or_path={tmp_path / 'opt'}", "model.from_config=true") == []  # not asked for
