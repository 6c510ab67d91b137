"""Throughput, FLOPs and MFU of real short runs through the CLI: every logging step's record in
metrics.jsonl and TensorBoard, the whole run's figures in summary.json, the startup line, and a CPU
run saying once that it reports no MFU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from supertune.telemetry.flops import FORMULA, architecture, flop_count

pytestmark = pytest.mark.slow

QUICK = [
    "training.max_steps=6", "training.logging_steps=2", "training.save_strategy=no", "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1", "data.max_eval_samples=32",
]  # fmt: skip
PER_LOG = (
    "throughput_tokens_per_s",
    "throughput_tokens_per_s_per_device",
    "step_time_s",
    "tokens_per_step",
    "tflops_per_device",
    "data_wait_share",
)
SUMMARY = PER_LOG + (
    "mfu", "hfu", "hardware_tflops_per_device", "peak_device_memory_gb", "peak_host_memory_gb", "measured_steps", "devices", "nodes",
    "flops_formula", "flops_per_token", "flops_per_token_forward", "hardware_flops_per_token", "flops_sequence_length",
    "peak_tflops_per_device", "peak_source", "peak_dtype",
)  # fmt: skip


def _train(run_dir, *overrides):
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), *QUICK, *overrides],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return (
        proc.stdout + proc.stderr,
        [r for r in records if "loss" in r],
        json.loads((run_dir / "summary.json").read_text()),
    )


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """Packed blocks of 128 tokens, gradient checkpointing on, TensorBoard on (the default)."""
    run_dir = tmp_path_factory.mktemp("telemetry") / "run"
    return (run_dir, *_train(run_dir, "model.gradient_checkpointing=true"))


def test_every_logging_step_records_the_figures(checkpointed):
    _, _, records, summary = checkpointed
    assert [r["step"] for r in records] == [1, 2, 4, 6]  # logging_first_step, then every 2
    for r in records:
        assert all(r[k] > 0 for k in PER_LOG if k != "data_wait_share"), r
        assert 0 <= r["data_wait_share"] < 1
        assert r["tokens_per_step"] == 16 * 128  # packing: every slot is a token, all micro-batches of the step
        assert r["throughput_tokens_per_s_per_device"] == r["throughput_tokens_per_s"]  # one process
        flops = r["throughput_tokens_per_s"] * summary["flops_per_token"] / 1e12
        assert r["tflops_per_device"] == pytest.approx(flops, rel=1e-4)
        assert r["hardware_tflops_per_device"] > r["tflops_per_device"]  # checkpointing recomputes the layers
        assert "mfu" not in r and "hfu" not in r  # CPU: no peak, no MFU


def test_summary_holds_the_run_figures_the_formula_and_the_peak(checkpointed):
    run_dir, _, _, summary = checkpointed
    assert set(SUMMARY) <= set(summary)
    assert summary["measured_steps"] == 5  # steps 2..6: the first pays for warm-up
    assert summary["mfu"] is None and summary["hfu"] is None and summary["peak_tflops_per_device"] is None
    assert summary["peak_source"].startswith("CPU") and "no MFU" in summary["peak_source"]
    assert summary["devices"] == "1 x CPU" and summary["nodes"] == 1 and summary["peak_device_memory_gb"] is None
    assert FORMULA in summary["flops_formula"] and "3x forward" in summary["flops_formula"]
    config = json.loads((run_dir / "model" / "config.json").read_text())
    expected = flop_count(architecture(config), 128, recompute=True)
    assert summary["flops_per_token"] == expected.training and summary["hardware_flops_per_token"] == expected.hardware
    assert summary["flops_sequence_length"] == 128
    assert summary["tflops_per_device"] == pytest.approx(summary["throughput_tokens_per_s"] * expected.training / 1e12)
    # Steps only, so at least the Trainer's rate over the whole train() call.
    assert summary["throughput_tokens_per_s"] >= 0.8 * summary["tokens_per_second"]


def test_the_startup_log_states_the_plan_and_says_no_mfu_once(checkpointed):
    _, output, _, _ = checkpointed
    assert "world size 1; global batch 16 sequences = 2048 tokens per step" in output
    plan = [line for line in output.splitlines() if "FLOPs per token" in line]
    assert len(plan) == 1 and "devices 1 x CPU on 1 node" in plan[0] and FORMULA in plan[0]
    assert "training = 3 x" in plan[0] and "with recomputation" in plan[0]
    assert output.count("MFU not reported") == 1 and output.count("no MFU") == 1


def test_tensorboard_gets_the_same_figures(checkpointed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, records, _ = checkpointed
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for key in PER_LOG + ("hardware_tflops_per_device",):
        assert f"train/{key}" in tags, sorted(tags)
    logged = [e.value for e in events.Scalars("train/throughput_tokens_per_s")]
    assert logged == pytest.approx([r["throughput_tokens_per_s"] for r in records], rel=1e-5)


def test_padded_batches_count_only_real_tokens(tmp_path):
    from supertune.embedded import generate_documents

    data = tmp_path / "train.jsonl"
    docs = [" ".join(d.split()[: 5 + 7 * (i % 6)]) for i, d in enumerate(generate_documents(7, 300))]  # 5 to 40 words
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    _, records, summary = _train(
        tmp_path / "run",
        f"data.train_files={data}",
        "data.packing=false",
        "data.max_length=64",
        "training.report_to=[]",
    )
    for before, r in zip(records, records[1:]):
        # The Trainer's count of non-padding tokens, over the steps since the previous record.
        assert (
            r["tokens_per_step"] * (r["step"] - before["step"])
            == r["num_input_tokens_seen"] - before["num_input_tokens_seen"]
        )
    assert all(r["tokens_per_step"] < 16 * 64 for r in records)  # pads are slots, not tokens
    assert summary["flops_sequence_length"] == 64  # the attention term at the padded length
