"""What the model must do with document-masked rows (data.document_mask), checked on every forward that carries them.

Such a row (supertune.training_data.document_bins) comes with position ids that restart at 0 for each
document and without an attention mask. transformers 5 turns the restarts into a block-diagonal
causal mask for SDPA and eager attention, but three things make a model attend across the
documents without a word:

- a KV cache (or an attention mask) in the forward: the packed mask is only built without them.
  Models are configured with `use_cache=True` by default and then make a cache even in training;
  the Trainer sets use_cache=False on the model it trains, a model loaded elsewhere keeps its own;
- a model whose code does not hand its position ids to transformers' mask builder. Most do; OPT
  derives its positions from the attention mask, BLOOM and MPT use ALiBi: all three attend across
  the restarts;
- flash attention with more than one row per batch: it sees the restarts on its own only in a
  batch of one row, and otherwise needs the documents' cumulative lengths as keyword arguments
  (for its variable-length kernel).

`keep_packed_rows_apart` installs a forward pre-hook that acts only on calls with position ids,
no attention mask and no cache (no other supertune batch looks like that): it refuses a model type
or attention implementation not verified to keep the rows apart, turns the cache off for the
call, gives flash attention the documents' boundaries, and gives a model switched to flex attention
for these rows (supertune.modeling.flex_documents) their document block mask.
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from .flex_documents import ATTENTION as FLEX_DOCUMENTS
from .flex_documents import document_block_mask

__all__ = [
    "MASKED_ATTENTION",
    "VERIFIED_MODEL_TYPES",
    "keep_packed_rows_apart",
    "packed_rows_problem",
    "varlen_arguments",
]

# Model types whose per-document logits are those of the documents run alone, with SDPA and eager
# attention (each entry is built from its config class and checked by tests/test_packing_exact.py).
VERIFIED_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "granite",
    "starcoder2",
    "smollm3",
    "gpt_neox",
    "gpt2",
)

# Attention implementations that build their mask from transformers' mask functions, packed rows included.
MASKED_ATTENTION = ("sdpa", "eager")


def packed_rows_problem(model_type: str | None, attention: str | None) -> str | None:
    """Why a model cannot train on document-masked rows (one line naming the key and the fix), or None."""
    if model_type not in VERIFIED_MODEL_TYPES:
        return (
            f"data.document_mask: model type {model_type!r} is not verified to keep packed documents apart "
            f"(supported: {', '.join(VERIFIED_MODEL_TYPES)}); use one of them or set data.document_mask=false"
        )
    if attention is not None and attention not in (*MASKED_ATTENTION, FLEX_DOCUMENTS) and not _is_flash(attention):
        return (
            f"data.document_mask: attention implementation {attention!r} would attend across packed documents; "
            "set model.attn_implementation to sdpa, eager or flash_attention_2, or data.document_mask=false"
        )
    return None


def _is_flash(attention: str) -> bool:
    from transformers.utils.generic import is_flash_attention_requested

    return bool(is_flash_attention_requested(requested_attention_implementation=attention))


def varlen_arguments(position_ids: Any) -> dict[str, Any] | None:
    """Flash attention's variable-length arguments for rows whose positions restart at 0 per document,
    over the batch flattened into one sequence; None when a row does not start at position 0."""
    import torch

    if not bool((position_ids[:, 0] == 0).all()):
        return None
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    bounds = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())  # one device sync per forward
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}


def keep_packed_rows_apart(model: Any) -> None:
    """Install the pre-hook on a transformers model (before any LoRA wrapping); see the module docstring."""
    config = model.config

    def hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        positions = kwargs.get("position_ids")
        if positions is None or kwargs.get("attention_mask") is not None or kwargs.get("past_key_values") is not None:
            return None
        attention = config._attn_implementation
        problem = packed_rows_problem(config.model_type, attention)
        if problem:
            raise UserError(problem)
        kwargs["use_cache"] = False
        if _is_flash(attention) and positions.dim() == 2 and positions.shape[0] > 1:
            kwargs.update(varlen_arguments(positions) or {})
        elif attention == FLEX_DOCUMENTS and positions.dim() == 2:
            kwargs["attention_mask"] = document_block_mask(positions)  # passed through to every layer as it is
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)
