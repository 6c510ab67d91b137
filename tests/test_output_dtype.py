"""output.dtype: the saved model cast after training, tensor by tensor, whatever the training precision;
config.json says the new dtype and plain transformers loads it in that dtype."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from supertune.cli.main import main
from supertune.errors import UserError
from supertune.train.lifecycle.output_dtype import cast_saved_model


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("choice", "dtype", "name"), [("fp16", torch.float16, "float16"), ("bf16", torch.bfloat16, "bfloat16")]
)
def test_a_sharded_model_is_cast_as_torch_rounds_and_loads_in_that_dtype(tmp_path, choice, dtype, name):
    from transformers import AutoModelForCausalLM

    model = _tiny_model()
    model.save_pretrained(tmp_path, max_shard_size="60KB")  # several shards and an index
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2
    before = {k: v for shard in shards for k, v in load_file(shard).items()}

    assert cast_saved_model(tmp_path, choice) == name
    after = {k: v for shard in sorted(tmp_path.glob("model-*.safetensors")) for k, v in load_file(shard).items()}
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == dtype, key
        assert torch.equal(after[key].view(torch.int16), value.to(dtype).view(torch.int16)), key  # every bit
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == name
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(v.numel() * 2 for v in after.values())
    assert not list(tmp_path.glob(".*cast*"))

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert {p.dtype for p in reloaded.parameters()} == {dtype}
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = model(ids, labels=ids).loss
        got = reloaded.float()(ids, labels=ids).loss
    assert abs(float(got) - float(expected)) < 1e-2


def test_same_and_adapters_are_left_as_they_are(tmp_path):
    assert cast_saved_model(tmp_path, "fp16") is None  # no full weights (e.g. LoRA adapters only)
    _tiny_model().save_pretrained(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    assert cast_saved_model(tmp_path, "same") is None
    assert (tmp_path / "model.safetensors").read_bytes() == data


def test_a_value_beyond_fp16_is_refused_and_the_model_left_as_saved(tmp_path):
    model = _tiny_model()
    with torch.no_grad():
        model.lm_head.weight[3, 5] = 7.0e4
    model.save_pretrained(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(
        UserError, match=r"output.dtype: tensor 'lm_head.weight' has values up to 7e\+04, beyond what F16 can hold"
    ):
        cast_saved_model(tmp_path, "fp16")
    assert (tmp_path / "model.safetensors").read_bytes() == data and not list(tmp_path.glob(".*cast*"))
    assert cast_saved_model(tmp_path, "bf16") == "bfloat16"  # bf16 has fp32's range


def test_fp16_weights_under_bf16_training_point_to_output_dtype(capsys):
    assert main(["config", "show", "model.dtype=fp16", "training.bf16=true"]) == 2
    assert "set model.dtype=fp32 (or bf16) and output.dtype=fp16" in capsys.readouterr().err


def test_a_run_trained_in_bf16_saves_its_model_in_fp16(tmp_path, capsys):
    """The two-site Llama recipe's precision: bf16 mixed precision in training, the model saved in half precision."""
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    args = [
        "train",
        "--run-dir",
        str(run),
        "training.max_steps=3",
        "training.bf16=true",
        "output.dtype=fp16",
        "model.config_overrides=num_hidden_layers=1",
        "training.report_to=[]",
        "generate.max_new_tokens=0",
        "training.per_device_train_batch_size=4",
        "data.max_eval_samples=16",
        "training.save_strategy=no",
    ]
    assert main(args) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mixed_precision"] == "bf16"
    weights = load_file(run / "model" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float16}
    assert json.loads((run / "model" / "config.json").read_text())["dtype"] == "float16"
    model = AutoModelForCausalLM.from_pretrained(run / "model")
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    size = (run / "model" / "model.safetensors").stat().st_size
    assert size < 2.1 * sum(p.numel() for p in model.parameters())  # 2 bytes a parameter (plus the header)
