"""Short real runs of the options a user combines: LoRA, streaming, padding, own tokenizer, models from disk."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from supertune.cli.main import main

pytestmark = pytest.mark.slow

QUICK = ["training.max_steps=4", "training.logging_steps=1", "training.save_strategy=no", "generate.max_new_tokens=4"]


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    from supertune.embedded import generate_documents

    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps({"text": d, "topic": "stories"}) + "\n" for d in generate_documents(7, 300)))
    return path


def _train(run_dir, *overrides):
    code = main(["train", "--run-dir", str(run_dir), *QUICK, *overrides])
    assert code == 0
    return json.loads((run_dir / "summary.json").read_text())


def test_lora_trains_only_adapter_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    _train(tmp_path / "run", "model.lora.enabled=true", "model.lora.r=4", "training.learning_rate=1e-2")
    adapters = load_file(tmp_path / "run" / "model" / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert any(t.abs().sum() > 0 for k, t in adapters.items() if "lora_B" in k)  # B starts at zero: it trained
    # The base weights saved beside the adapters are exactly the freshly initialised ones.
    fresh_dir = tmp_path / "fresh"
    _train(fresh_dir, "training.learning_rate=1e-12", "training.max_steps=1")
    fresh = load_file(fresh_dir / "model" / "model.safetensors")
    base = load_file(tmp_path / "run" / "base_model" / "model.safetensors")
    assert fresh.keys() == base.keys()
    for key in fresh:
        assert torch.allclose(fresh[key], base[key], atol=1e-6), key
    # and plain transformers loads base + adapters from model/
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert any("lora" in n for n, _ in model.named_parameters())


def test_lora_merge_on_save_gives_a_plain_model(tmp_path):
    _train(tmp_path / "run", "model.lora.enabled=true", "model.lora.merge_on_save=true", "training.learning_rate=1e-2")
    weights = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert not any("lora" in k for k in weights)
    assert not (tmp_path / "run" / "model" / "adapter_config.json").exists()


def test_streaming_run(tmp_path, jsonl):
    summary = _train(tmp_path / "run", f"data.train_files={jsonl}", "data.streaming=true")
    assert summary["train_steps"] == 4
    assert summary["train_tokens"] == 4 * 16 * 128


def test_padding_run_counts_only_real_tokens(tmp_path, jsonl):
    summary = _train(tmp_path / "run", f"data.train_files={jsonl}", "data.packing=false", "data.max_length=256")
    assert 0 < summary["train_tokens"] < 4 * 16 * 256


def test_template_and_trained_tokenizer(tmp_path, jsonl):
    from supertune.paths import cache_dir

    before = set((cache_dir() / "tokenizers").glob("data-*")) if (cache_dir() / "tokenizers").exists() else set()
    _train(
        tmp_path / "run",
        f"data.train_files={jsonl}",
        "model.tokenizer=train",
        "model.tokenizer_vocab_size=512",
        "data.template=Write a document about {topic}: {text}",
    )
    after = set((cache_dir() / "tokenizers").glob("data-*"))
    assert len(after - before) == 1
    tok = json.loads((tmp_path / "run" / "model" / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) <= 512


def test_local_model_directory_and_config_overrides(tmp_path):
    _train(tmp_path / "first", "model.config_overrides=num_hidden_layers=1")
    config = json.loads((tmp_path / "first" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    # fine-tune the saved model, then pre-train a variant of its config with fresh weights
    _train(tmp_path / "second", f"model.name_or_path={tmp_path / 'first' / 'model'}")
    _train(
        tmp_path / "third",
        f"model.name_or_path={tmp_path / 'first' / 'model'}",
        "model.from_config=true",
        "model.config_overrides=intermediate_size=64",
    )
    third = json.loads((tmp_path / "third" / "model" / "config.json").read_text())
    assert third["intermediate_size"] == 64 and third["num_hidden_layers"] == 1


def test_unknown_config_override_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), *QUICK, "model.config_overrides=num_hiden_layers=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        "model.config_overrides: 'num_hiden_layers' (did you mean num_hidden_layers?) not a field of LlamaConfig" in err
    )


def test_uncached_hub_model_offline_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), *QUICK, "model.name_or_path=some-org/not-downloaded"])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        "model.name_or_path: 'some-org/not-downloaded' is not a local directory and not in the Hugging Face cache"
        in err
    )
    assert "HF_HUB_OFFLINE" in err


def test_unreachable_hub_fails_fast_not_hangs(tmp_path, monkeypatch, capsys):
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(
        constants, "ENDPOINT", "https://hub.invalid"
    )  # .invalid never resolves, like a node without DNS to the hub
    started = time.time()
    code = main(["train", "--run-dir", str(tmp_path / "run"), *QUICK, "model.name_or_path=some-org/not-downloaded"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot be reached from this machine" in err
    assert time.time() - started < 30


def test_a_finished_run_dir_is_never_trained_again(tmp_path, capsys):
    _train(tmp_path / "run", "training.max_steps=1")
    before = (tmp_path / "run" / "summary.json").read_bytes()
    capsys.readouterr()
    code = main(["train", "--run-dir", str(tmp_path / "run"), *QUICK])
    assert code == 0
    assert "has already finished; nothing to resume" in capsys.readouterr().out
    code = main(["train", "--run-dir", str(tmp_path / "run"), "--no-resume", *QUICK])
    assert code == 2
    assert "already holds a run and --no-resume was given" in capsys.readouterr().err
    assert (tmp_path / "run" / "summary.json").read_bytes() == before


def test_bf16_weights_are_trained_and_saved_in_bf16(tmp_path):
    _train(tmp_path / "run", "model.dtype=bf16")
    weights = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_dataset_name_can_be_a_local_dataset_directory(tmp_path, jsonl):
    data_dir = tmp_path / "my_dataset"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text(jsonl.read_text())
    summary = _train(tmp_path / "run", f"data.dataset_name={data_dir}")
    assert summary["train_steps"] == 4


def test_uncached_hub_dataset_offline_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), *QUICK, "data.dataset_name=some-org/not-downloaded"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(
        "supertune: error: data.dataset_name: cannot load 'some-org/not-downloaded' from the local cache"
    )


def test_eval_command_on_other_files(tmp_path, jsonl, capsys):
    _train(tmp_path / "run", "training.max_steps=2")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "model"), "--data", str(jsonl), "data.block_size=64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("eval loss ") and "perplexity" in out
    tokens = sum(1 for _ in jsonl.open())  # at least one token per document
    assert int(out.split("sequences, ")[1].split()[0]) > tokens


def test_save_model_false_saves_no_model(tmp_path, capsys):
    summary = _train(tmp_path / "run", "output.save_model=false", "training.max_steps=1")
    assert summary["train_steps"] == 1
    assert not (tmp_path / "run" / "model").exists()
    assert "model not saved (output.save_model=false)" in capsys.readouterr().out
