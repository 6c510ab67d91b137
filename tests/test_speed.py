"""training.speed: auto takes the exact speed-ups this run allows and trains to the same losses as plain;
the choice is said at the start and recorded in summary.json; a bad name is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supertune.config.errors import ConfigError
from supertune.config.load import build_run_config
from supertune.config.speed_pieces import SPEED_PIECES
from supertune.modeling.speed import SPEEDUPS, RunFacts, take_speedups

NOT_DOCUMENT_MASKED = "data.document_mask=false: only document-masked packing has a block mask to use"
CPU_COMPILE = "CPU: compiled layers were slower than eager here, after a minute of compiling; CUDA only"

SHORT = [
    "training.max_steps=8",
    "training.logging_steps=1",
    "training.save_strategy=no",
    "training.report_to=[]",
    "training.per_device_train_batch_size=8",
    "generate.max_new_tokens=0",
    "data.max_eval_samples=16",
]


def _train(run_dir: Path, *extra: str) -> tuple[dict[int, float], dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), *SHORT, *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    return losses, json.loads((run_dir / "summary.json").read_text()), proc.stdout + proc.stderr


def test_auto_trains_to_the_losses_of_plain_and_says_what_it_took(tmp_path):
    plain, plain_summary, plain_log = _train(tmp_path / "plain", "training.speed=plain")
    auto, auto_summary, auto_log = _train(tmp_path / "auto")  # auto is the default
    assert len(plain) == 8 and plain.keys() == auto.keys()
    for step, loss in plain.items():
        assert abs(auto[step] - loss) <= 1e-5 * abs(loss), (step, loss, auto[step])
    assert abs(auto_summary["eval_loss"] - plain_summary["eval_loss"]) <= 1e-5 * plain_summary["eval_loss"]
    assert auto_summary["speed"] == {
        "mode": "auto",
        "device": "cpu",
        "taken": ["chunked_cross_entropy", "fused_adamw"],
        "left_out": {"flex_document_mask": NOT_DOCUMENT_MASKED, "compile": CPU_COMPILE},
    }
    assert plain_summary["speed"]["taken"] == []
    assert plain_summary["speed"]["left_out"] == {
        "chunked_cross_entropy": "training.speed=plain",
        "fused_adamw": "training.speed=plain",
        "flex_document_mask": "training.speed=plain",
        "compile": "training.speed=plain",
    }
    assert (
        "speed: auto on CPU: chunked_cross_entropy, fused_adamw; left out: "
        f"flex_document_mask ({NOT_DOCUMENT_MASKED}); compile ({CPU_COMPILE})\n" in auto_log
    )
    assert (
        "speed: plain on CPU: none; left out: chunked_cross_entropy (training.speed=plain); "
        "fused_adamw (training.speed=plain); flex_document_mask (training.speed=plain); compile (training.speed=plain)"
        in plain_log
    )


def test_what_auto_leaves_out_and_why():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    fsdp = take_speedups(llama, "auto", [], RunFacts("fsdp", "cpu"))
    assert fsdp.taken == [] and fsdp.left_out == {
        "chunked_cross_entropy": "distributed.strategy=fsdp: runs under ddp only",
        "fused_adamw": "distributed.strategy=fsdp: runs under ddp only",
        "flex_document_mask": NOT_DOCUMENT_MASKED,
        "compile": CPU_COMPILE,
    }
    assert "forward" not in vars(llama) and fsdp.trainer_arguments == {}  # nothing applied
    skip = ["chunked_cross_entropy", "compile"]
    skipped = take_speedups(llama, "auto", skip, RunFacts("ddp", "cuda", "adamw_torch"))
    assert skipped.left_out == {
        "chunked_cross_entropy": "training.speed_skip",
        "flex_document_mask": NOT_DOCUMENT_MASKED,
        "compile": "training.speed_skip",
    }
    assert skipped.trainer_arguments == {"optim": "adamw_torch_fused"}
    assert skipped.line() == (
        "speed: auto on CUDA: fused_adamw; left out: chunked_cross_entropy (training.speed_skip); "
        f"flex_document_mask ({NOT_DOCUMENT_MASKED}); compile (training.speed_skip)"
    )
    sgd = take_speedups(llama, "auto", ["chunked_cross_entropy"], RunFacts("ddp", "cpu", "sgd"))
    assert sgd.left_out["fused_adamw"] == "training.optim=sgd: replaces adamw_torch only"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32))
    gpt2_choice = take_speedups(gpt2, "auto", [], RunFacts("ddp", "cpu"))
    assert "model type 'gpt2'" in gpt2_choice.left_out["chunked_cross_entropy"] and gpt2_choice.taken == ["fused_adamw"]
    taken = take_speedups(llama, "auto", [], RunFacts("ddp", "cpu"))
    assert taken.taken == ["chunked_cross_entropy", "fused_adamw"] and "forward" in vars(llama)


def test_every_speed_up_the_config_names_has_its_record():
    assert list(SPEEDUPS) == list(SPEED_PIECES)


def test_an_unknown_name_in_speed_skip_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as err:
        build_run_config({"training": {"speed_skip": ["chunked_crossentropy"]}})
    assert str(err.value) == (
        "training.speed_skip: 'chunked_crossentropy' is not a speed-up; name any of chunked_cross_entropy, fused_adamw, "
        "flex_document_mask, compile"
    )
    bad = subprocess.run(
        [sys.executable, "-m", "supertune", "config", "show", "training.speed=fast"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "training.speed" in bad.stderr and "Traceback" not in bad.stderr
