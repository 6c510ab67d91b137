"""Sharding strategies end to end: `supertune train --nproc 2` (real torchrun, gloo, CPU) under DeepSpeed ZeRO.

Each run trains the embedded tiny Llama for 6 steps at a global batch of 16 and is compared with a
DDP run at the same global batch: the issue's tolerance for ZeRO is 1e-3 on the loss.
"""

from __future__ import annotations

import json

import pytest

from strategy_runs import train_run

pytestmark = pytest.mark.slow

TOLERANCE = 1e-3


def _assert_matches_ddp(ddp, losses, summary):
    _, ddp_losses, ddp_summary = ddp
    assert sorted(losses) == sorted(ddp_losses) and len(losses) == 6
    worst = max(abs(losses[s] - ddp_losses[s]) for s in losses)
    assert worst <= TOLERANCE, (worst, losses, ddp_losses)
    assert abs(summary["eval_loss"] - ddp_summary["eval_loss"]) <= TOLERANCE
    # each rank read its own half of every batch, as under DDP
    assert summary["world_size"] == 2 and summary["train_tokens"] == ddp_summary["train_tokens"]
    assert summary["sample"]


def test_zero2_matches_ddp(ddp, tmp_path):
    losses, summary = train_run(tmp_path / "run", "distributed.strategy=zero2")
    _assert_matches_ddp(ddp, losses, summary)
    s = summary["sharding"]
    assert (s["wrapper"], s["zero_stage"], s["offload"]) == ("DeepSpeedEngine", 2, "none")
    assert s["held_fraction"] <= 0.55  # this rank keeps about half of the fp32 optimizer copy
    written = json.loads((tmp_path / "run" / "deepspeed_config.json").read_text())
    assert written["zero_optimization"]["stage"] == 2 and written["train_micro_batch_size_per_gpu"] == "auto"


def test_zero2_with_cpu_offload_matches_ddp(ddp, tmp_path):
    losses, summary = train_run(tmp_path / "run", "distributed.strategy=zero2", "distributed.offload=cpu")
    _assert_matches_ddp(ddp, losses, summary)
    assert (summary["sharding"]["zero_stage"], summary["sharding"]["offload"]) == (2, "cpu")


def test_zero3_shards_matches_ddp_and_saves_a_plain_16bit_gathered_model(ddp, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from supertune.config import load_saved_config
    from supertune.evaluation.perplexity import evaluate_saved_model

    run_dir = tmp_path / "run"
    losses, summary = train_run(run_dir, "distributed.strategy=zero3")
    _assert_matches_ddp(ddp, losses, summary)
    s = summary["sharding"]
    assert (s["zero_stage"], s["offload"]) == (3, "none")
    assert 0.45 <= s["held_fraction"] <= 0.55  # rank 0 holds half of every parameter between uses
    # model/ is one full checkpoint gathered from both ranks, loadable with plain transformers
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert all(p.numel() > 0 for p in model.parameters())
    reloaded = evaluate_saved_model(str(run_dir / "model"), load_saved_config(run_dir / "config.yaml"))
    assert abs(reloaded["eval_loss"] - summary["eval_loss"]) <= 1e-5
    # and its weights are the DDP run's
    ddp_weights = load_file(ddp[0] / "model" / "model.safetensors")
    zero3_weights = load_file(run_dir / "model" / "model.safetensors")
    assert ddp_weights.keys() == zero3_weights.keys()
    assert max((ddp_weights[k] - zero3_weights[k]).abs().max().item() for k in ddp_weights) <= 1e-4


def test_lora_under_zero3_saves_adapters_that_reload(ddp, tmp_path):
    """LoRA on pretrained weights (the DDP run's model) with sharded base weights."""
    from safetensors.torch import load_file

    from supertune.config import load_saved_config
    from supertune.evaluation.perplexity import evaluate_saved_model

    run_dir = tmp_path / "run"
    _, summary = train_run(
        run_dir,
        "distributed.strategy=zero3",
        "model.lora.enabled=true",
        f"model.name_or_path={ddp[0] / 'model'}",
        "training.learning_rate=1e-2",
    )
    assert summary["sharding"]["zero_stage"] == 3
    adapters = load_file(run_dir / "model" / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert any(t.abs().sum() > 0 for k, t in adapters.items() if "lora_B" in k)  # B starts at zero: it trained
    reloaded = evaluate_saved_model(str(run_dir / "model"), load_saved_config(run_dir / "config.yaml"))
    assert abs(reloaded["eval_loss"] - summary["eval_loss"]) <= 1e-5
    assert reloaded["eval_loss"] < ddp[2]["eval_loss"]  # the adapters moved the loss
