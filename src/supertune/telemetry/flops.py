"""FLOPs per token of a Hugging Face causal LM, from its config: the one count behind TFLOP/s and MFU.

Per token and per decoder layer, a forward pass costs 2 FLOPs per multiply-accumulate of every
matmul with a weight, at the layer's real shape:

    q, k, v, o projections   2·d·(h + 2·kv)·dh + 2·h·dh·d    (grouped-query attention: kv < h heads)
    MLP                      2·m·d·f, m = 3 matrices when gated (SwiGLU, GeGLU), else 2
    MoE (instead of the MLP) 2·d·E (router) + k·2·3·d·f_e (top-k experts) + shared experts
    attention scores         4·S·h·dh  (q·kᵀ and scores·v over the sequence length S)

plus the output projection 2·d·V once (tied embeddings too: the input side is a lookup, no
matmul). The attention term counts the whole S x S square, as PaLM and Megatron-LM do and as
torch's FlopCounterMode measures SDPA; causal kernels skip about half of it.

Training costs 3x the forward (the backward computes gradients of the inputs and of the weights,
2 matmuls for each forward one). With frozen base weights (LoRA) the weight matmuls cost 2x, not
3x. Gradient checkpointing recomputes every decoder layer's forward once more (or every Nth
layer's): hardware FLOPs, which the model's count (MFU) leaves out and HFU includes. See docs/telemetry.md.

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMULA",
    "Architecture",
    "FlopCount",
    "UnsupportedModel",
    "architecture",
    "fit_to_model",
    "flop_count",
    "model_matmul_weights",
    "recomputed_share",
]

FORMULA = "supertune-flops-v1"
"""Name of the formula above, written into summary.json and the startup log."""

# Model types whose MLP is gated (three matrices: gate, up, down; or a fused gate_up and down).
GATED_MLP = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi3", "olmo", "olmo2", "olmo3", "olmoe", "granite", "granitemoe", "cohere", "cohere2", "stablelm", "smollm3",
    "glm", "glm4", "exaone4", "ernie4_5", "hunyuan_v1_dense", "internlm2", "helium", "gpt_oss", "ministral", "seed_oss",
})  # fmt: skip
# Model types whose MLP is two matrices (up, down).
PLAIN_MLP = frozenset({
    "gpt2", "gpt_bigcode", "opt", "gpt_neox", "gpt_neo", "gptj", "codegen", "bloom", "falcon", "phi", "starcoder2",
    "mpt", "biogpt", "xglm",
})  # fmt: skip
# Attention or mixing layers this count does not describe.
UNSUPPORTED = {
    "deepseek_v2": "multi-head latent attention",
    "deepseek_v3": "multi-head latent attention",
    "mamba": "state-space layers",
    "mamba2": "state-space layers",
    "falcon_mamba": "state-space layers",
    "jamba": "state-space layers",
    "rwkv": "recurrent layers",
    "recurrent_gemma": "recurrent layers",
    "qwen3_next": "linear-attention layers",
}


class UnsupportedModel(ValueError):
    """The formula does not describe this model; throughput is still reported, FLOPs and MFU are not."""


@dataclass(frozen=True)
class Architecture:
    """The shapes the count needs, read from a model config."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    """Intermediate width of a dense MLP."""
    gated_mlp: bool
    vocab: int
    tied_embeddings: bool
    experts: int = 0
    """Routed experts of a MoE layer; 0: dense."""
    experts_per_token: int = 0
    expert_mlp: int = 0
    shared_expert_mlp: int = 0
    shared_expert_gate: bool = False
    moe_layers: int = 0
    """Layers whose MLP is the MoE block; the others have the dense MLP."""
    embed_proj: int = 0
    """OPT's word_embed_proj_dim when it differs from hidden: projections in and out around the layers."""
    assumed: str = ""
    """What was assumed rather than known (an unknown model type), empty when nothing was."""

    @property
    def head_out(self) -> int:
        """Width the output projection reads."""
        return self.embed_proj or self.hidden

    def matmul_weights(self) -> int:
        """Weights of every matmul (every expert, the output projection once): to check against a built model."""
        d, dh = self.hidden, self.head_dim
        attention = d * (self.heads + 2 * self.kv_heads) * dh + self.heads * dh * d
        dense = (3 if self.gated_mlp else 2) * d * self.mlp
        moe = (
            self.experts * 3 * d * self.expert_mlp
            + d * self.experts
            + 3 * d * self.shared_expert_mlp
            + d * self.shared_expert_gate
        )
        layers = self.layers * attention + (self.layers - self.moe_layers) * dense + self.moe_layers * moe
        return layers + self.head_out * self.vocab + (2 * self.embed_proj * d if self.embed_proj else 0)


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per token (non-padding) at one sequence length, split as the multipliers need them."""

    arch: Architecture
    sequence_length: int
    layer_matmuls: float
    """Forward FLOPs of the decoder layers' weight matmuls."""
    attention_scores: float
    """Forward FLOPs of q·kᵀ and scores·v over the sequence length, all layers."""
    outside_layers: float
    """Forward FLOPs of the output projection (and OPT's projections in and out)."""
    frozen_weights: bool = False
    """The base weights get no gradients (LoRA): their backward is one matmul, not two."""
    recompute: float = 0.0
    """Share of the decoder layers whose forward runs again in the backward: 1 under full gradient
    checkpointing, ceil(layers / N) / layers checkpointing every Nth (recomputed_share), 0 without."""

    @property
    def forward(self) -> float:
        return self.layer_matmuls + self.attention_scores + self.outside_layers

    @property
    def training(self) -> float:
        """Model FLOPs of one training token: 3x forward (2x for frozen weight matmuls). MFU divides these."""
        weights = (2 if self.frozen_weights else 3) * (self.layer_matmuls + self.outside_layers)
        return weights + 3 * self.attention_scores

    @property
    def hardware(self) -> float:
        """What the hardware computes: with gradient checkpointing, the layers' forward once more (about 4x forward)."""
        return self.training + self.recompute * (self.layer_matmuls + self.attention_scores)

    def describe(self) -> str:
        """The formula in one line, for the log and summary.json."""
        parts = [
            f"{FORMULA}: weight matmuls of the layer shapes + attention 4·S·h·dh per layer (S={self.sequence_length}); training = 3x forward"
        ]
        if self.frozen_weights:
            parts.append("frozen base weights (LoRA): their matmuls 2x")
        if self.recompute == 1:
            parts.append("hardware + 1 forward of the layers (gradient checkpointing)")
        elif self.recompute:
            parts.append(f"hardware + {self.recompute:.3g} of a forward of the layers (gradient checkpointing of some)")
        if self.arch.assumed:
            parts.append(f"assumed: {self.arch.assumed}")
        return "; ".join(parts)


def architecture(config: Any) -> Architecture:
    """The shapes of a transformers config (or a dict of one); UnsupportedModel when they cannot be read."""
    if isinstance(config, dict):
        config = _Fields(config)
    elif hasattr(config, "get_text_config"):
        config = config.get_text_config()
    model_type = str(getattr(config, "model_type", "") or "unknown")
    if model_type in UNSUPPORTED or getattr(config, "kv_lora_rank", None):
        raise UnsupportedModel(
            f"no FLOP formula for {model_type} ({UNSUPPORTED.get(model_type, 'multi-head latent attention')})"
        )
    layers, hidden, heads = (_int(config, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    vocab = _int(config, "vocab_size")
    if not (layers and hidden and heads and vocab):
        raise UnsupportedModel(
            f"no FLOP formula for {model_type}: its config does not give layers, hidden size, heads and vocabulary"
        )
    head_dim = _int(config, "head_dim") or hidden // heads
    experts = _int(config, "num_local_experts") or _int(config, "num_experts") or _int(config, "n_routed_experts")
    mlp = _mlp_width(config, model_type, hidden)
    gated, assumed = _gated(config, model_type)
    moe: dict[str, Any] = {}
    if experts:
        moe = {
            "experts": experts,
            "experts_per_token": _int(config, "num_experts_per_tok") or 1,
            "expert_mlp": _int(config, "moe_intermediate_size") or mlp,
            "shared_expert_mlp": _int(config, "shared_expert_intermediate_size")
            or _int(config, "n_shared_experts") * (_int(config, "moe_intermediate_size") or 0),
            "shared_expert_gate": bool(_int(config, "shared_expert_intermediate_size")),
            "moe_layers": _moe_layers(config, layers),
        }
    embed_proj = _int(config, "word_embed_proj_dim") if model_type == "opt" else 0
    return Architecture(
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=_kv_heads(config, model_type, heads),
        head_dim=head_dim,
        mlp=mlp,
        gated_mlp=gated,
        vocab=vocab,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        embed_proj=embed_proj if embed_proj and embed_proj != hidden else 0,
        assumed=assumed,
        **moe,
    )


def recomputed_share(layers: int, every: int) -> float:
    """The share of `layers` decoder layers gradient checkpointing recomputes when it checkpoints every
    `every`th (the 1st, the every+1th, ...: model.gradient_checkpointing_every)."""
    return -(-layers // every) / layers if layers else 1.0


def flop_count(
    arch: Architecture, sequence_length: int, frozen_weights: bool = False, recompute: float = 0.0
) -> FlopCount:
    """FLOPs per token at `sequence_length` (the length of the training sequences: data.block_size when packing)."""
    d, dh, h = arch.hidden, arch.head_dim, arch.heads
    attention_proj = 2 * d * (h + 2 * arch.kv_heads) * dh + 2 * h * dh * d
    dense_mlp = 2 * (3 if arch.gated_mlp else 2) * d * arch.mlp
    moe = 2 * d * arch.experts + arch.experts_per_token * 2 * 3 * d * arch.expert_mlp
    moe += 2 * 3 * d * arch.shared_expert_mlp + (2 * d if arch.shared_expert_gate else 0)
    layer_matmuls = arch.layers * attention_proj + (arch.layers - arch.moe_layers) * dense_mlp + arch.moe_layers * moe
    outside = 2 * arch.head_out * arch.vocab + (2 * 2 * arch.embed_proj * d if arch.embed_proj else 0)
    return FlopCount(
        arch=arch,
        sequence_length=sequence_length,
        layer_matmuls=float(layer_matmuls),
        attention_scores=float(arch.layers * 4 * sequence_length * h * dh),
        outside_layers=float(outside),
        frozen_weights=frozen_weights,
        recompute=recompute,
    )


def model_matmul_weights(model: Any) -> int:
    """Weights of a built model that matmuls use: every parameter of 2 or more dimensions except
    embedding lookups, biases and LoRA adapters, plus the output projection once when it is tied to the
    input embedding. Compared with Architecture.matmul_weights() to catch a misread config."""
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    total = sum(
        _numel(p) for name, p in model.named_parameters()
        if p.ndim >= 2 and id(p) not in embeddings and "lora_" not in name and not name.endswith("bias")  # MoE experts' biases are 2-D
    )  # fmt: skip
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and id(head.weight) in embeddings:
        total += _numel(head.weight)
    return int(total)


def _numel(p: Any) -> int:
    """Elements of a parameter, also when DeepSpeed ZeRO-3 has partitioned it away (ds_numel)."""
    return int(getattr(p, "ds_numel", None) or p.numel())


def fit_to_model(arch: Architecture, model: Any) -> tuple[Architecture, str | None]:
    """The architecture checked against the built model's weights: for a model type the table
    does not know, the other MLP guess is taken when only it matches; returns (architecture,
    problem or None)."""
    from dataclasses import replace

    have = model_matmul_weights(model)
    if have == 0 or have == arch.matmul_weights():  # 0: parameters not materialised here (nothing to check)
        return arch, None
    if arch.assumed:
        flipped = "gated" if not arch.gated_mlp else "two-matrix"
        other = replace(arch, gated_mlp=not arch.gated_mlp, assumed=f"{flipped} MLP (from the model's weights)")
        if other.matmul_weights() == have:
            return other, None
    expected = arch.matmul_weights()
    return arch, (
        f"the FLOP formula reads {expected:,} matmul weights from the {arch.model_type} config, the model has {have:,} "
        f"({100 * (expected - have) / have:+.1f} %): FLOPs and MFU are off by about as much"
    )


class _Fields:
    """Attribute access to a config dict (a config.json read without transformers)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _int(config: Any, key: str) -> int:
    value = getattr(config, key, None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _kv_heads(config: Any, model_type: str, heads: int) -> int:
    if model_type == "falcon":
        if getattr(config, "new_decoder_architecture", False):
            return _int(config, "num_kv_heads") or heads
        return 1 if getattr(config, "multi_query", False) else heads
    if model_type == "gpt_bigcode":
        return 1 if getattr(config, "multi_query", True) else heads
    return _int(config, "num_key_value_heads") or heads


def _mlp_width(config: Any, model_type: str, hidden: int) -> int:
    if model_type == "opt":
        return _int(config, "ffn_dim") or 4 * hidden
    if model_type == "falcon":
        return _int(config, "ffn_hidden_size") or 4 * hidden
    if model_type == "mpt":
        return int(getattr(config, "expansion_ratio", 4) * hidden)
    return _int(config, "intermediate_size") or _int(config, "n_inner") or 4 * hidden


def _gated(config: Any, model_type: str) -> tuple[bool, str]:
    if model_type in GATED_MLP:
        return True, ""
    if model_type in PLAIN_MLP:
        return False, ""
    act = str(getattr(config, "hidden_act", None) or getattr(config, "activation_function", "") or "")
    gated = act in ("silu", "swish", "swiglu")
    return (
        gated,
        f"{'gated' if gated else 'two-matrix'} MLP for unknown model type {model_type!r} (hidden_act {act or 'unset'})",
    )


def _moe_layers(config: Any, layers: int) -> int:
    """Layers with the MoE block: every decoder_sparse_step-th, minus mlp_only_layers and the first first_k_dense_replace."""
    step = _int(config, "decoder_sparse_step") or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    first = _int(config, "first_k_dense_replace")
    return sum(1 for i in range(layers) if i not in dense and i >= first and (i + 1) % step == 0)
