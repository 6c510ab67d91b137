"""Activation (gradient) checkpointing of all decoder layers, or of every Nth (model.gradient_checkpointing_every).

A checkpointed layer keeps only its input in the forward pass and runs its forward again in the
backward pass to get the rest; the others keep all their activations. Every Nth layer is the
selective form (torchtitan's per-layer "selective" checkpointing): with N=2 half the layers keep
their activations, which costs about half the memory full checkpointing saves, and half its
recomputation (one layer's forward in N, about 1/(3N) of the step's compute instead of 1/3).

The recomputation is transformers' own (GradientCheckpointingLayer wraps each layer's forward in
torch.utils.checkpoint, non-reentrant); which layers use it is each layer's `gradient_checkpointing`
flag, set here by position: the 1st, the N+1th, and so on, so that N=1 is full checkpointing and
N at or above the depth checkpoints the first layer alone. transformers 5.23 can count the same way
(activation_checkpointing_enable(every_n_layers=...)); older 5.x cannot, so the flags are set here.
"""

from __future__ import annotations

from typing import Any

from .decoder_layers import decoder_layers

__all__ = ["enable_checkpointing", "checkpointed_layers"]


def enable_checkpointing(model: Any, every: int = 1) -> None:
    """Checkpoint every `every`th decoder layer of `model` (a transformers model, before LoRA)."""
    # Non-reentrant: the form torch.compile can trace (modeling/compiled_layers.py) and the one that
    # keeps gradients of inputs passed by keyword. transformers 5.23 renamed the call and warns on the
    # old name, which older 5.x have alone.
    arguments = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=arguments)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=arguments)
    model.config.use_cache = False  # the cache is useless in training and conflicts with recomputation
    for index, layer in enumerate(decoder_layers(model)):
        layer.gradient_checkpointing = index % every == 0


def checkpointed_layers(model: Any) -> list[int]:
    """Positions of the decoder layers that recompute their forward in the backward pass."""
    return [i for i, layer in enumerate(decoder_layers(model)) if layer.gradient_checkpointing]
