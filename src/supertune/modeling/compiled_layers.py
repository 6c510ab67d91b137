"""The `compile` speed-up: every decoder layer's training forward through torch.compile (inductor).

Per layer, not the whole model, because:
- the work is in the layers and they are all alike: one layer's graph is traced and compiled once
  (the layers share their code, and the graph takes their weights as inputs: dynamo's
  inline_inbuilt_nn_modules, on by default in the PyTorch pinned here), so compile time does not
  grow with the depth, as it would for one graph of the whole model;
- what sits between the layers stays eager, where it has data-dependent Python: transformers' mask
  building from packed position ids, supertune's document pre-hook (modeling/packed_attention.py) and
  flex block mask, the chunked loss (modeling/chunked_loss.py), LoRA's wrapper, the Trainer's loss
  scaling; a whole-model graph would break or recompile there;
- the hooks stay outside the compiled code: FSDP2's all-gather and reshard around each layer
  (fully_shard units are the same decoder layers, as torchtitan compiles and shards per block),
  DDP's gradient hooks on the parameters, and transformers' per-layer gradient checkpointing, which
  wraps the layer's forward (GradientCheckpointingLayer): the compiled code is that wrapper with the
  layer inside, so a checkpointed layer is compiled with its recomputation and an unchecked one
  without (two graphs at most, whatever model.gradient_checkpointing_every says);
- the module tree, its names and its state dict do not change (the layer's `forward` is replaced on
  the instance), so checkpoints, LoRA saving, FSDP's state dicts and the final model are as before.

training.torch_compile is the Trainer's own whole-model compilation (accelerate wraps the model in
torch.compile's OptimizedModule); the two together would compile the layers twice, so `compile` is
left out when it is set.

Only training calls are compiled: in eval mode, with gradients off, or given a KV cache, the layer runs
its eager code, so that padded evaluation batches of every length and generation with a growing cache
compile nothing.

No recompiling per step: packed training batches all have one shape (per-device batch x block), and
the document boundaries are data: SDPA's 4-D mask is a tensor of that shape, and the flex block mask
(modeling/flex_documents.py) holds tensors whose shapes follow the row length only; the guards check
shapes, dtypes and the layer's flags (training, gradient_checkpointing), never values. The cache is
switched off (config.use_cache) as gradient checkpointing does, since a cache object passed to the
layers in training would be guarded on its state, which changes from layer to layer. What compiles
once more: a batch none of whose rows holds a boundary (transformers then gives SDPA no mask, its
causal path), and a last batch with fewer rows (dynamo then treats the batch size as dynamic).
tests/test_compiled_layers.py counts one compilation over steps with different boundaries. Past
dynamo's recompile limit (8 variants of one function) a new variant would run eager: slower, not wrong.

Cost: the first training step compiles (not yet timed on a GPU; on CPU inductor writes and builds
C++ kernels: 61-101 s for the embedded model on a busy 2-core machine, docs/speed.md); the compiled
forward keeps the activations its fused backward needs, as eager does.
"""

from __future__ import annotations

import functools
from typing import Any

from .decoder_layers import decoder_layers

__all__ = ["BACKEND", "compile_unfit_reason", "compile_layers", "compiled_layer_count"]

BACKEND = "inductor"
"""torch.compile's backend: inductor makes the fused kernels (Triton on CUDA, C++ on CPU)."""


def compile_unfit_reason(model: Any) -> str | None:
    """Why `model`'s layers cannot be compiled here (one line), or None."""
    if not decoder_layers(model):
        return f"{type(model).__name__} has no decoder layers transformers can checkpoint (GradientCheckpointingLayer)"
    return None


def compile_layers(model: Any) -> None:
    """Route every decoder layer's training forward through one compiled function."""
    model.config.use_cache = False  # see the module docstring: no cache object guarded in training
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_forward, layer)


def compiled_layer_count(model: Any) -> int:
    """How many of the model's decoder layers run compiled in training."""
    return sum(isinstance(vars(layer).get("forward"), functools.partial) for layer in decoder_layers(model))


def _forward(layer: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    if layer.training and torch.is_grad_enabled() and kwargs.get("past_key_values") is None:
        return _compiled()(layer, *args, **kwargs)
    return _class_forward(layer, *args, **kwargs)


def _class_forward(layer: Any, *args: Any, **kwargs: Any) -> Any:
    # Looked up on each call: FSDP2's fully_shard, applied after this, gives the layer a subclass
    # whose forward is the checkpointing wrapper transformers counts as the outermost.
    return type(layer).forward(layer, *args, **kwargs)


@functools.cache
def _compiled() -> Any:
    import torch

    return torch.compile(_class_forward, backend=BACKEND)
