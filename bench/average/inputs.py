"""The benchmark's inputs: N copies of one Llama-shaped model of about 500 MB in float32, each with its
own random weights, saved as a Hugging Face model directory (config, generation config, tokenizer,
one model.safetensors), so that every arm can read them: supertune, from_pretrained and mergekit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

__all__ = ["MODEL_CONFIG", "make_models", "model_bytes"]

# 129.8 M parameters, 519 MB in float32; the largest tensors are the untied embedding and output
# matrices, 32000 x 1024 (131 MB each).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "dtype": "float32",
}


def _shapes() -> dict[str, tuple[int, ...]]:
    c = MODEL_CONFIG
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "lm_head.weight": (v, h),
        "model.norm.weight": (h,),
    }
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (h, h),
            p + "self_attn.v_proj.weight": (h, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


def model_bytes() -> tuple[int, int]:
    """(bytes of all weights, bytes of the largest tensor) in float32."""
    sizes = [4 * int(np.prod(s)) for s in _shapes().values()]
    return sum(sizes), max(sizes)


def make_models(root: Path, count: int, tokenizer_dir: Path, seed: int = 0) -> list[Path]:
    """root/model-0 ... model-{count-1}; existing complete ones are kept (a marker file says complete)."""
    from safetensors.numpy import save_file

    paths = []
    for k in range(count):
        path = root / f"model-{k}"
        paths.append(path)
        if (path / ".complete").is_file():
            continue
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        rng = np.random.default_rng(seed + k)
        tensors = {}
        for name, shape in _shapes().items():
            if "norm" in name:
                tensors[name] = (1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
            else:
                tensors[name] = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        (path / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
        (path / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}) + "\n"
        )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tokenizer_dir / name, path / name)
        (path / ".complete").write_text("")
    return paths
