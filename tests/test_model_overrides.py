"""model.config_overrides build the model they describe: fields derived from the overridden ones
(head_dim from hidden_size and num_attention_heads) follow them, stated ones stay."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, LlamaConfig

from supertune.config.schema import ModelConfig
from supertune.embedded.tokenizer import default_tokenizer
from supertune.modeling.model import build_model


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(default_tokenizer()))


def _attention(model) -> tuple[int, tuple[int, int]]:
    return model.config.head_dim, tuple(model.model.layers[0].self_attn.q_proj.weight.shape)


def test_wider_model_from_the_embedded_config_gets_full_width_attention(tokenizer):
    """The embedded default has 4 heads of 32; hidden 256 with 4 heads is 4 heads of 64."""
    m = ModelConfig(from_config=True, config_overrides={"hidden_size": 256, "num_hidden_layers": 1})
    assert _attention(build_model(m, tokenizer)) == (64, (256, 256))


def test_a_stated_head_dim_is_kept(tokenizer):
    m = ModelConfig(from_config=True, config_overrides={"hidden_size": 256, "head_dim": 32, "num_hidden_layers": 1})
    assert _attention(build_model(m, tokenizer)) == (32, (128, 256))


def test_a_saved_config_with_a_derived_head_dim_follows_its_overrides(tokenizer, tmp_path):
    """A saved Llama config writes head_dim out; when it equals hidden/heads it was derived."""
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    ).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["head_dim"] == 32
    m = ModelConfig(
        name_or_path=str(tmp_path),
        from_config=True,
        config_overrides={"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8},
    )
    assert _attention(build_model(m, tokenizer)) == (32, (256, 256))
    m = ModelConfig(
        name_or_path=str(tmp_path),
        from_config=True,
        config_overrides={"num_attention_heads": 2, "num_key_value_heads": 2},
    )
    assert _attention(build_model(m, tokenizer)) == (64, (128, 128))
