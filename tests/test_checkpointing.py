"""Selective activation checkpointing (model.gradient_checkpointing_every): every Nth decoder layer
recomputes its forward, the others keep their activations; the losses and gradients are those of no
checkpointing, in one process and under DDP; a bad setting is one line naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from strategy_runs import COMMON, run_losses
from supertune.config.errors import ConfigError
from supertune.config.load import build_run_config
from supertune.modeling.checkpointing import checkpointed_layers
from supertune.telemetry.flops import recomputed_share
from test_compiled_layers import _batches, _model, _train


@pytest.fixture(scope="module")
def tokenizer():
    from supertune.modeling.tokenizer import load_tokenizer

    return load_tokenizer(build_run_config({}))


def test_every_nth_layer_recomputes_and_trains_to_the_losses_and_gradients_of_none(tokenizer):
    four = {"config_overrides": {"num_hidden_layers": 4}}  # the embedded default's depth
    batches = _batches(len(tokenizer), 3)
    none = _model(tokenizer, **four)
    assert checkpointed_layers(none) == []
    reference, reference_grads = _train(none, batches)
    for every, layers in ((1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3]), (8, [0])):
        model = _model(tokenizer, gradient_checkpointing=True, gradient_checkpointing_every=every, **four)
        assert checkpointed_layers(model) == layers
        assert recomputed_share(4, every) == len(layers) / 4
        losses, grads = _train(model, batches)
        assert all(abs(a - b) <= 1e-6 * abs(a) for a, b in zip(reference, losses)), (every, reference, losses)
        assert grads.keys() == reference_grads.keys()
        assert max((grads[n] - reference_grads[n]).abs().max().item() for n in grads) <= 1e-6, every


def test_a_bad_every_is_one_line_naming_the_field_and_the_fix():
    with pytest.raises(ConfigError) as err:
        build_run_config({"model": {"gradient_checkpointing_every": 2}})
    assert str(err.value) == (
        "model.gradient_checkpointing_every: 2 chooses the layers gradient checkpointing recomputes; "
        "set model.gradient_checkpointing=true, or leave it at 1"
    )
    with pytest.raises(ConfigError) as err:
        build_run_config({"model": {"gradient_checkpointing": True, "gradient_checkpointing_every": 0}})
    assert str(err.value) == "model.gradient_checkpointing_every: must be 1 or more (every Nth decoder layer), got 0"


@pytest.mark.slow
def test_every_second_layer_under_ddp_trains_to_the_losses_of_none(ddp, tmp_path):
    """Two processes (torchrun, gloo): the session's DDP run, and the same with layers 0 and 2 of 4
    checkpointed; DDP reduces the gradients while the backward recomputes."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), "--nproc", "2", *COMMON]
        + ["model.gradient_checkpointing=true", "model.gradient_checkpointing_every=2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "gradient checkpointing: decoder layers 0, 2 of 4 recompute their forward (model.gradient_checkpointing_every=2)"
        in proc.stdout + proc.stderr
    )
    losses, summary = run_losses(run_dir)
    _, ddp_losses, ddp_summary = ddp
    assert sorted(losses) == sorted(ddp_losses) and len(losses) == 6
    assert max(abs(losses[s] - ddp_losses[s]) for s in losses) <= 1e-6 * max(ddp_losses.values())
    assert abs(summary["eval_loss"] - ddp_summary["eval_loss"]) <= 1e-6 * ddp_summary["eval_loss"]
    assert summary["sharding"]["wrapper"] == "DistributedDataParallel"
