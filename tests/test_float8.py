"""training.float8: which modules torchao's float8 training swaps on the embedded model, and its
refusals, all on CPU. The float8 matmuls themselves need a GPU of compute capability >= 8.9 (bench/gpu.py's
"throughput-float8" arm); converting a model needs none, so the wiring is checked here."""

from __future__ import annotations

import pytest
import torch

from supertune.config import ModelConfig
from supertune.config.errors import ConfigError
from supertune.config.load import build_run_config
from supertune.errors import UserError
from supertune.modeling.decoder_layers import decoder_layers
from supertune.modeling.float8 import float8_device_problem, float8_linears, refuse_float8_device
from supertune.modeling.model import build_model
from supertune.modeling.speed import RunFacts, take_speedups
from supertune.modeling.tokenizer import load_tokenizer
from supertune.runs.local import check_local_start

PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_run_config({}))


def _model(tokenizer, **overrides):
    return build_model(ModelConfig(config_overrides=overrides), tokenizer)  # type: ignore[arg-type]


def test_every_linear_of_the_decoder_layers_and_nothing_else(tokenizer):
    model = _model(tokenizer)
    chosen = float8_linears(model)
    layers = len(decoder_layers(model))
    assert sorted(chosen.values()) == sorted(f"layers.{i}.{name}" for i in range(layers) for name in PROJECTIONS + MLP)
    assert id(model.lm_head) not in chosen
    assert id(model.get_input_embeddings()) not in chosen


def test_dimensions_not_multiples_of_16_stay(tokenizer):
    # intermediate_size 200: the MLP's weights are 128 x 200, which torch._scaled_mm cannot take.
    model = _model(tokenizer, intermediate_size=200)
    assert not any("mlp." in name for name in float8_linears(model).values())
    assert any("self_attn.q_proj" in name for name in float8_linears(model).values())


def test_the_conversion_swaps_those_modules_only(tokenizer):
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    model = _model(tokenizer)
    names = {id(m): n for n, m in model.named_modules()}
    expected = {names[i] for i in float8_linears(model)}
    choice = take_speedups(model, "plain", [], RunFacts(strategy="ddp", device="cpu"), float8=True)
    swapped = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == expected and len(swapped) == choice.float8_linears == 7 * len(decoder_layers(model))
    assert type(model.lm_head) is torch.nn.Linear
    assert choice.record()["float8_linears"] == len(swapped)
    assert "; float8: " in choice.line()


def test_no_float8_no_torchao_and_no_record(tokenizer):
    choice = take_speedups(_model(tokenizer), "plain", [], RunFacts(strategy="ddp", device="cpu"))
    assert choice.float8_linears is None and "float8_linears" not in choice.record()


REFUSAL = (
    "training.float8: needs a GPU with float8 matmuls (H100/H200, Ada: compute capability >= 8.9); "
    "this run is on CPU: remove training.float8"
)


def test_refused_on_cpu_before_the_run_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as refused:
        refuse_float8_device()
    assert str(refused.value) == REFUSAL
    with pytest.raises(UserError) as refused:
        check_local_start(build_run_config({"training": {"float8": True}}))
    assert str(refused.value) == REFUSAL
    check_local_start(build_run_config({}))  # without float8 the same start goes on


def test_refused_on_gpus_without_float8_matmuls():
    assert float8_device_problem("cuda", "NVIDIA H200", (9, 0)) is None
    assert float8_device_problem("cuda", "NVIDIA L4", (8, 9)) is None
    refusal = float8_device_problem("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
    assert refusal and refusal.endswith(
        "this run is on NVIDIA A100-SXM4-80GB (compute capability 8.0): remove training.float8"
    )


def test_config_refuses_what_it_does_not_compose_with():
    with pytest.raises(ConfigError) as error:
        build_run_config(
            {"training": {"float8": True}, "distributed": {"strategy": "zero3"}, "model": {"lora": {"enabled": True}}}
        )
    problems = [p for p in error.value.problems if p.startswith("training.float8")]
    assert problems == [
        "training.float8: needs distributed.strategy=ddp, got zero3; remove training.float8",
        "training.float8: not with model.lora.enabled (float8 under LoRA adapters is untested); remove one",
    ]


def test_torchao_is_imported_only_inside_the_conversion():
    # A run without training.float8 never pays torchao's import (seconds: it registers its kernels).
    import ast
    from pathlib import Path

    importers = []
    for path in Path(__file__).parents[1].joinpath("src", "supertune").rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [module or ""]
            if isinstance(node, ast.Import | ast.ImportFrom) and any(n.split(".")[0] == "torchao" for n in names):
                importers.append((path.name, id(node) in top))
    assert importers == [("float8.py", False)]
