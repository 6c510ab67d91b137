"""Document-masked packed rows (data.document_mask) through PyTorch's FlexAttention: flash speed without flash-attn.

Such a row (supertune.training_data.document_bins) carries position ids that restart per document
and no attention mask. With SDPA, transformers turns the restarts into a 4-D boolean mask, which
takes SDPA off its flash kernel onto the one that reads a mask (on CUDA: every query against every
key of the row, the blocks across documents computed and thrown away); flash attention's
variable-length kernel needs the flash-attn package, a compiled extension the GPU machines here do
not have. FlexAttention (torch.nn.attention.flex_attention) ships with PyTorch: given a BlockMask,
compiled on CUDA into a Triton kernel (Triton comes with PyTorch's CUDA wheels), it skips the
128 x 128 tiles the mask empties and applies the mask inside the others; it is exact, the same
softmax over the same keys.

How: the attention implementation ATTENTION, registered with transformers' AttentionInterface,
runs SDPA on every call (evaluation with padding, generation with a cache: all as before) except
those given a BlockMask, which run flex_attention. supertune.modeling.packed_attention's pre-hook,
which already recognises the document-masked calls, builds the BlockMask from the position ids
(`document_block_mask`) and hands it to the model as its attention mask; transformers passes a 4-D
mask through unchanged to every layer. transformers' own "flex_attention" implementation builds the
same document mask from packed position ids, but turns every call of the model to flex, padded
evaluation batches and cached generation included, where each new length compiles again; here only
the packed rows change path.

Recompiling: flex_attention is compiled once (`torch.compile`, default settings) and called by every
layer with tensors of one shape, since packed rows have one shape. The document boundaries are data:
they live in the BlockMask's tensors (block counts and indices, whose shapes follow the row length
only) and in the document-id tensor the mask function reads; the guards check those tensors' shapes
and dtypes and the mask function's code, never their values, so a new batch's boundaries reuse the
compiled kernel (tests/test_flex_documents.py counts the compilations over batches that differ).

Cost: the BlockMask is made once per forward from a dense boolean mask of rows x length x length
(33 MB for 8 rows of 2,048 tokens; the compiled kernel reads the block indices, not that mask),
shared by all layers and kept for the backward pass; the first step compiles the kernel (tens of
seconds). On CPU, PyTorch's flex_attention has no backward pass and runs uncompiled, the scores of
the whole row written out like SDPA's math path: exact, used by the tests, and left out by
supertune.modeling.speed.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["ATTENTION", "FLEX_MODEL_TYPES", "document_block_mask", "flex_unfit_reason", "use_flex_documents"]

ATTENTION = "sdpa_flex_documents"
"""The attention implementation a model is switched to: SDPA, and flex_attention for document-masked rows."""

FLEX_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "phi3",
    "olmo2",
    "granite",
    "starcoder2",
    "smollm3",
    "gpt_neox",
)
"""Model types whose attention is transformers' functional attention with one causal mask for every
layer, no soft-capping and nothing added to the scores: the per-document losses through flex_attention equal
the documents run alone (tests/test_flex_documents.py builds each). gemma2 soft-caps its scores and
gemma3 alternates sliding-window layers, which the one mask made here does not carry; gpt2 adds
attention dropout by default and is not verified."""


def flex_unfit_reason(model: Any) -> str | None:
    """Why `model` cannot run its document-masked rows through flex_attention (one line), or None."""
    config = model.config
    if config.model_type not in FLEX_MODEL_TYPES:
        return f"model type {config.model_type!r} is not verified with flex attention"
    attention = config._attn_implementation
    if attention != "sdpa":
        return f"attention {attention!r}: replaces sdpa only"
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types) or (window is not None and not layer_types):
        # The one BlockMask made per forward is causal within each document; a window would need its own.
        return f"sliding-window attention (sliding_window={window}): the document mask here has no window"
    dropout = getattr(config, "attention_dropout", 0.0) or 0.0
    if dropout > 0:
        return f"attention_dropout={dropout}: flex attention has no dropout"
    return None


def use_flex_documents(model: Any) -> None:
    """Switch `model` (a transformers model, or a LoRA wrapper around one) to ATTENTION."""
    _register()
    model.set_attn_implementation(ATTENTION)


def document_block_mask(position_ids: Any) -> Any:
    """The BlockMask of rows whose positions restart per document: causal, and within one document.

    A new document starts wherever a position is not the one before plus one, the rule transformers
    uses for packed position ids (masking_utils.find_packed_sequence_indices), so that this mask and
    SDPA's agree token for token, the padding at a block's end included (its own document)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    before_first = position_ids[:, :1] - 1
    documents = (torch.diff(position_ids, prepend=before_first, dim=-1) != 1).cumsum(-1)

    def causal_within_document(batch: Any, head: Any, query: Any, key: Any) -> Any:
        return (query >= key) & (documents[batch, query] == documents[batch, key])

    rows, length = position_ids.shape
    return create_block_mask(causal_within_document, rows, None, length, length, device=position_ids.device)


def _sdpa_or_flex(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """ATTENTION: flex_attention for a BlockMask (document-masked rows), transformers' SDPA for anything else."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout or kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        # flex_unfit_reason keeps such models off this path; reaching here is a model it did not foresee.
        raise ValueError(f"{ATTENTION}: the document block mask carries no dropout, soft-capping or sliding window")
    # Inside a model that training.torch_compile compiles whole, the outer compilation takes flex_attention in.
    flex = flex_attention if torch.compiler.is_compiling() else _flex_attention(query.device.type)
    out = flex(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _flex_attention(device_type: str) -> Any:
    """flex_attention compiled on CUDA, where compiling makes it the fused kernel (uncompiled it is a
    reference implementation that writes out every score); elsewhere uncompiled."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


@functools.cache
def _register() -> None:
    """ATTENTION in transformers' tables: the attention above, and SDPA's mask for the calls that build one."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _sdpa_or_flex)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
