"""`supertune average` against an independent computation: numpy (float64) over the tensors that
safetensors itself reads from the inputs, for every way of weighting, bf16 and fp32, sharded inputs
and outputs, LoRA adapters (averaged as tensors, and merged first), and the server step over two
rounds; then real training runs averaged into a model that transformers loads and `supertune eval` runs on."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from average_models import dtypes, make_checkpoint, save_adapter, save_model, tensors
from supertune.averaging import AVERAGE_MANIFEST, ServerStep, average_checkpoints, read_average_manifest
from supertune.cli.main import main
from supertune.weight_files.dtypes import narrow


def average(*argv: str) -> int:
    return main(["average", *map(str, argv)])


def expected(inputs, weights) -> dict[str, np.ndarray]:
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    loaded = [tensors(p) for p in inputs]
    return {name: sum(wi * t[name] for wi, t in zip(w, loaded, strict=True)) for name in loaded[0]}


def assert_close(out_dir, want: dict[str, np.ndarray], rtol: float, atol: float) -> None:
    got = tensors(out_dir)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Three sharded fp32 checkpoints with different tokens and samples seen."""
    root = tmp_path_factory.mktemp("ckpts")
    counts = [(1000, 10), (3000, 90), (6000, 20)]
    return [
        make_checkpoint(save_model(root / f"c{i}", 10 + i, shard="20KB"), tokens=t, samples=s)
        for i, (t, s) in enumerate(counts)
    ]


@pytest.mark.parametrize(
    "flag, raw",
    [
        ("tokens", [1000, 3000, 6000]),
        ("samples", [10, 90, 20]),
        ("uniform", [1, 1, 1]),
        ("2,0,1", [2, 0, 1]),
    ],
)
def test_weights_match_numpy(checkpoints, tmp_path, flag, raw):
    out = tmp_path / "avg"
    assert average(*checkpoints, "--out", out, "--weights", flag, "--max-shard-size", "30KB") == 0
    assert_close(out, expected(checkpoints, raw), rtol=1e-6, atol=1e-7)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded output
    manifest = read_average_manifest(out)
    assert manifest.weights == ("explicit" if "," in flag else flag)
    assert np.allclose([i["weight"] for i in manifest.inputs], np.asarray(raw) / sum(raw))
    assert manifest.tokens == 10000 and manifest.samples == 120
    for inp, ckpt in zip(manifest.inputs, checkpoints, strict=True):
        ckpt_manifest = json.loads((ckpt / "supertune-checkpoint.json").read_text())
        for name, digest in inp["files"].items():  # every input file hashed, equal to the checkpoint's record
            assert digest["sha256"] == ckpt_manifest["files"][name]["sha256"]


def test_bf16_inputs_average_in_fp32_and_round_once(tmp_path):
    inputs = [save_model(tmp_path / f"m{i}", i, dtype=torch.bfloat16, shard="20KB") for i in range(3)]
    want = expected(inputs, [1, 2, 3])
    assert average(*inputs, "--out", tmp_path / "same", "--weights", "1,2,3") == 0
    assert dtypes(tmp_path / "same") == {torch.bfloat16}
    assert_close(tmp_path / "same", want, rtol=2**-8, atol=1e-30)  # one bf16 rounding of the float32 sum
    assert average(*inputs, "--out", tmp_path / "fp32", "--weights", "1,2,3", "--dtype", "fp32") == 0
    assert dtypes(tmp_path / "fp32") == {torch.float32}
    assert_close(tmp_path / "fp32", want, rtol=1e-6, atol=1e-8)
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"


def test_fp32_inputs_written_as_bf16_and_fp16(checkpoints, tmp_path):
    want = expected(checkpoints, [1, 1, 1])
    for flag, dtype, rtol in (("bf16", torch.bfloat16, 2**-8), ("fp16", torch.float16, 2**-11)):
        assert average(*checkpoints, "--out", tmp_path / flag, "--weights", "uniform", "--dtype", flag) == 0
        assert dtypes(tmp_path / flag) == {dtype}
        assert_close(tmp_path / flag, want, rtol=rtol, atol=1e-7)


def test_narrowing_matches_torch_bit_for_bit():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(100_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 100_000),
            np.array(
                [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.0e38, -3.0e38, 1e-45, 65504.0, 65520.0], dtype=np.float32
            ),
        ]
    ).astype(np.float32)
    scratch, out16 = np.empty(values.size, np.uint32), np.empty(values.size, np.uint16)
    bf16, _ = narrow(values, "BF16", scratch, out16)
    assert np.array_equal(bf16, torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    small = values[np.abs(values) < 60000]
    fp16, finite = narrow(small, "F16", scratch, out16)
    assert finite and np.array_equal(fp16, torch.from_numpy(small).to(torch.float16).numpy())


def test_averages_of_averages_equal_the_flat_average(checkpoints, tmp_path):
    """Token weights of an output are the sum of its inputs': averaging in two steps changes nothing."""
    assert average(checkpoints[0], checkpoints[1], "--out", tmp_path / "ab") == 0
    assert average(tmp_path / "ab", checkpoints[2], "--out", tmp_path / "abc") == 0
    assert average(*checkpoints, "--out", tmp_path / "flat") == 0
    assert_close(tmp_path / "abc", tensors(tmp_path / "flat"), rtol=1e-6, atol=1e-7)
    assert read_average_manifest(tmp_path / "abc").tokens == 10000


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = save_model(root / "base", 0)
    return base, [save_adapter(root / f"a{i}", base, seed=20 + i) for i in range(2)]


def test_adapters_average_as_tensors_and_load_with_peft(adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    base, inputs = adapters
    out = tmp_path / "avg"
    assert average(*inputs, "--out", out, "--weights", "3,1") == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        AVERAGE_MANIFEST,
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert_close(out, expected(inputs, [3, 1]), rtol=1e-6, atol=1e-8)
    assert read_average_manifest(out).kind == "adapter"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_merge_first_averages_the_merged_models(adapters, tmp_path):
    """Against peft's own merge of each adapter into the base, averaged with numpy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, inputs = adapters
    out = tmp_path / "merged"
    assert average(*inputs, "--out", out, "--weights", "3,1", "--merge-first", "--base", base) == 0
    merged = []
    for a in inputs:
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), a).merge_and_unload()
        merged.append({k: v.to(torch.float64).numpy() for k, v in model.state_dict().items()})
    got = tensors(out)
    assert set(got) == set(tensors(base))
    for name, value in got.items():
        np.testing.assert_allclose(
            value, 0.75 * merged[0][name] + 0.25 * merged[1][name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    changed = "model.layers.0.self_attn.q_proj.weight"
    assert not np.allclose(got[changed], tensors(base)[changed])
    assert read_average_manifest(out).kind == "merged" and not any("lora" in k for k in got)
    AutoModelForCausalLM.from_pretrained(out)


def test_server_momentum_over_two_rounds_matches_a_hand_computation(tmp_path):
    g0 = save_model(tmp_path / "g0", 0)
    round1 = [save_model(tmp_path / f"r1-{i}", 1 + i) for i in range(2)]
    round2 = [save_model(tmp_path / f"r2-{i}", 5 + i) for i in range(2)]
    lr, beta = 0.7, 0.9
    for i, m in enumerate(round1 + round2):
        make_checkpoint(m, tokens=100 * (i + 1), samples=i + 1)
    step1 = ServerStep(global_model=g0, lr=lr, momentum=beta)
    average_checkpoints(round1, tmp_path / "g1", server=step1)
    step2 = ServerStep(global_model=tmp_path / "g1", lr=lr, momentum=beta)  # momentum found beside g1
    manifest = average_checkpoints(round2, tmp_path / "g2", server=step2)
    assert manifest.server["momentum_in"]["path"] == str(tmp_path / "g1" / "server-momentum.safetensors")

    g = tensors(g0)
    avg1 = expected(round1, [100, 200])
    v1 = {k: avg1[k] - g[k] for k in g}
    g1 = {k: g[k] + lr * v1[k] for k in g}
    avg2 = expected(round2, [300, 400])
    v2 = {k: beta * v1[k] + (avg2[k] - g1[k]) for k in g}
    g2 = {k: g1[k] + lr * v2[k] for k in g}
    assert_close(tmp_path / "g1", g1, rtol=1e-5, atol=1e-6)
    assert_close(tmp_path / "g2", g2, rtol=1e-5, atol=1e-6)
    momentum = {
        k: v.to(torch.float64).numpy() for k, v in load_file(tmp_path / "g2" / "server-momentum.safetensors").items()
    }
    for k in g:
        np.testing.assert_allclose(momentum[k], v2[k], rtol=1e-4, atol=1e-6, err_msg=k)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "g2")  # the momentum file beside the shards is not read as weights


def test_server_momentum_file_can_live_outside_the_output(tmp_path):
    g0 = save_model(tmp_path / "g0", 0)
    inputs = [save_model(tmp_path / f"m{i}", 1 + i) for i in range(2)]
    state = tmp_path / "federation" / "momentum.safetensors"
    args = ["--weights", "uniform", "--global-model", g0, "--server-momentum", "0.5", "--momentum-out", state]
    assert average(*inputs, "--out", tmp_path / "g1", *args) == 0
    assert state.is_file() and not (tmp_path / "g1" / "server-momentum.safetensors").exists()
    first = state.read_bytes()
    # the next round reads and replaces the same file
    assert (
        average(*inputs, "--out", tmp_path / "g2", *args[:3], tmp_path / "g1", *args[4:], "--momentum-in", state) == 0
    )
    assert state.read_bytes() != first
    assert not list(state.parent.glob(".*partial*"))


@pytest.mark.slow
def test_training_runs_average_into_a_model_that_loads_and_evaluates(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    runs = []
    for seed in (1, 2):
        run = tmp_path / f"site{seed}"
        quick = [
            "training.max_steps=3",
            "training.save_steps=2",
            "generate.max_new_tokens=0",
            "training.report_to=[]",
            "data.max_train_samples=400",
            "data.max_eval_samples=16",
        ]
        assert (
            main(
                [
                    "train",
                    "--run-dir",
                    str(run),
                    f"training.seed={seed}",
                    f"training.per_device_train_batch_size={4 * seed}",
                    *quick,
                ]
            )
            == 0
        )
        runs.append(run)
    out = tmp_path / "avg"
    assert average(*runs, "--out", out) == 0
    manifest = read_average_manifest(out)
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
    assert [i["tokens"] for i in manifest.inputs] == [s["train_tokens"] for s in summaries]
    assert manifest.inputs[0]["tokens_source"] == "run summary.json train_tokens"
    assert_close(
        out, expected([r / "model" for r in runs], [s["train_tokens"] for s in summaries]), rtol=1e-6, atol=1e-7
    )
    # a checkpoint of one run with the other run: tokens from the checkpoint manifest
    assert average(runs[0] / "checkpoints" / "checkpoint-2", runs[1], "--out", tmp_path / "mixed") == 0
    assert read_average_manifest(tmp_path / "mixed").inputs[0]["tokens_source"] == "checkpoint manifest tokens_seen"

    model = AutoModelForCausalLM.from_pretrained(out)
    assert torch.isfinite(model(torch.tensor([[0, 5, 9]])).logits).all()
    assert main(["eval", str(out), "data.max_eval_samples=16"]) == 0
    assert "eval loss" in capsys.readouterr().out
