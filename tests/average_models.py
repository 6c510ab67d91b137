"""The models the `supertune average` tests build: tiny Llamas saved by transformers, checkpoints with
real manifests, LoRA adapters saved by peft (a helper module of the tests, not a test file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from supertune.checkpoints.manifest import CheckpointManifest, file_digests, write_manifest

TINY = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}


def write_tokenizer(path: Path, variant: int = 0) -> None:
    """A small word-level tokenizer; another `variant` has another vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "<pad>", "<unk>"] + [f"w{variant}x{i}" for i in range(92)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def save_model(
    path: Path,
    seed: int,
    dtype: torch.dtype = torch.float32,
    shard: str | None = None,
    tokenizer: int | None = 0,
    **config,
) -> Path:
    """A tiny Llama with its own random weights, saved by transformers (sharded when `shard` is a size such as '20KB')."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{**TINY, **config})).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms start at exactly 1: make every tensor differ between models
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    if tokenizer is not None:
        write_tokenizer(path, tokenizer)
    return path


def make_checkpoint(path: Path, tokens: int, samples: int, step: int = 10) -> Path:
    """Give a saved model directory the manifest of a supertune checkpoint (sizes and sha256 of its files)."""
    write_manifest(
        path,
        CheckpointManifest(
            step=step,
            tokens_seen=tokens,
            samples_seen=samples,
            world_size=1,
            global_batch=8,
            epoch=0.5,
            files=file_digests(path),
        ),
    )
    return path


def save_adapter(path: Path, base: Path, seed: int, r: int = 4, alpha: int = 8, **lora) -> Path:
    """LoRA adapters on `base` saved by peft, with random A and B (B starts at zero in peft)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj", "v_proj"], **lora),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    write_tokenizer(path, 0)
    return path


def tensors(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of a saved model or adapter directory as float64, read with safetensors itself."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [f for f in ("model.safetensors", "adapter_model.safetensors") if (directory / f).is_file()][:1]
    out = {}
    for f in files:
        for name, t in load_file(directory / f).items():
            out[name] = t.to(torch.float64).numpy()
    return out


def dtypes(directory: Path) -> set[torch.dtype]:
    directory = Path(directory)
    return {
        t.dtype
        for f in directory.glob("*.safetensors")
        if not f.name.startswith("server-")  # the server optimizer's state, float32 whatever the model's dtype
        for t in load_file(f).values()
    }


# -- how MODEL arguments are resolved --------------------------------------------------------------
