"""How each kind of MODEL argument of `supertune average` is resolved: where its weights and its
count of tokens and samples come from."""

from __future__ import annotations

import json

import pytest

from average_models import make_checkpoint, save_model, tensors
from supertune.averaging import resolve_input
from supertune.errors import UserError


def test_a_checkpoint_gives_tokens_and_samples_from_its_manifest(tmp_path):
    ckpt = make_checkpoint(save_model(tmp_path / "checkpoint-10", 1), tokens=1234, samples=56)
    inp = resolve_input(ckpt)
    assert (inp.tokens, inp.samples, inp.described) == (1234, 56, "checkpoint")
    assert "tokens_seen" in inp.tokens_source and inp.checkpoint is not None


def test_a_sharded_model_is_read_through_its_index(tmp_path):
    model = save_model(tmp_path / "m", 1, shard="20KB")
    inp = resolve_input(model)
    assert inp.weights.index is not None and len(inp.weights.files) > 2
    assert set(inp.weights.where) == set(tensors(model))
    assert inp.tokens is None and "no checkpoint manifest" in inp.tokens_source


def test_a_run_directory_uses_its_model_and_summary(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    save_model(run / "model", 1)
    (run / "summary.json").write_text(json.dumps({"train_tokens": 4096, "train_steps": 8}))
    ckpt = run / "checkpoints" / "checkpoint-8"
    make_checkpoint(save_model(ckpt, 1), tokens=4096, samples=64, step=8)
    for arg in (run, run / "model"):
        inp = resolve_input(arg)
        assert inp.directory == run / "model"
        assert (inp.tokens, inp.tokens_source) == (4096, "run summary.json train_tokens")
        assert inp.samples == 64 and "checkpoint-8" in inp.samples_source


def test_an_unfinished_run_directory_uses_its_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    make_checkpoint(save_model(run / "checkpoints" / "checkpoint-4", 1), tokens=100, samples=4, step=4)
    (run / "checkpoints" / "latest").write_text("checkpoint-4\n")
    inp = resolve_input(run)
    assert inp.directory == run / "checkpoints" / "checkpoint-4" and inp.tokens == 100
    save_model(run / "model", 1)  # model/ written, summary.json not yet: the run did not finish
    with pytest.raises(UserError, match="no summary.json"):
        resolve_input(run)


def test_an_input_without_safetensors_is_refused_with_the_way_out(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(UserError, match="only safetensors weights are averaged"):
        resolve_input(tmp_path / "m")
    with pytest.raises(UserError, match="no such file"):
        resolve_input(tmp_path / "missing")
