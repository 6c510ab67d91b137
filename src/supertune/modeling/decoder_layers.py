"""The repeated decoder layers of a transformers causal LM, in order: what per-layer compilation and
selective activation checkpointing act on.

transformers 5 derives every decoder layer that can be checkpointed from GradientCheckpointingLayer;
those are the blocks FSDP's auto_wrap shards one by one too (the model's _no_split_modules name their
classes). A LoRA wrapper is looked through: peft puts its adapters inside the layers, not around them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["decoder_layers"]


def decoder_layers(model: Any) -> list[Any]:
    """The model's GradientCheckpointingLayer modules, in the order model.modules() meets them."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
