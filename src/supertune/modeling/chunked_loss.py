"""The causal LM loss without the full logits: the output layer and cross-entropy, a chunk of rows at a time.

A causal LM's training step writes logits of batch x sequence x vocabulary, in float32 for the loss:
8 x 4096 tokens of a 128k vocabulary is 16 GB, more than the rest of a 1B model's activations. Here
the output layer and the loss run over chunks of rows (CHUNK_ELEMENTS logits at a time); each
chunk's gradients with respect to its hidden states and to the output weight are taken while its
logits are at hand, so neither pass ever holds more than one chunk of logits and the backward pass
only scales what the forward pass kept. It is the same arithmetic as the model's own loss
(transformers' ForCausalLMLoss: float32 logits, labels shifted by one, -100 ignored, a sum over
`num_items_in_batch` or the mean over the targets): the loss and the gradients equal it to float
rounding (tests/test_chunked_loss.py: 1e-6 in float32). Its cost: the gradient of the output weight
is held in float32 from the forward pass to the backward pass (vocabulary x hidden floats, the size
of that weight's own gradient).

`use_chunked_loss(model)` gives a model of a plain architecture (CHUNKED_ARCHITECTURES) this loss in
training; evaluation, generation and any forward pass without labels or without gradients run the
model's own code unchanged. supertune.modeling.speed decides when.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "CHUNKED_ARCHITECTURES",
    "CHUNK_ELEMENTS",
    "chunked_linear_cross_entropy",
    "use_chunked_loss",
    "unfit_reason",
]

IGNORE_INDEX = -100
"""The label the loss skips (transformers' ignore_index)."""

CHUNK_ELEMENTS = 1 << 25
"""Logits computed at once (128 MB in float32): a 128k vocabulary in chunks of 256 rows, the
embedded model's 4,096-token vocabulary in chunks of 8,192."""

CHUNKED_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma"})
"""Model types whose causal-LM forward is the decoder, a bias-free output layer and the plain loss,
with nothing between the logits and the loss (no soft-capping, scaling or auxiliary loss)."""


def chunked_linear_cross_entropy(
    hidden: Any, weight: Any, targets: Any, num_items_in_batch: Any = None, chunk_elements: int = CHUNK_ELEMENTS
) -> Any:
    """The cross-entropy of `hidden @ weight.T` against `targets` (rows x hidden, vocabulary x hidden,
    rows), IGNORE_INDEX skipped: summed and divided by `num_items_in_batch` when given, else the
    mean over the targets kept, as transformers' loss does."""
    import torch

    rows = max(1, chunk_elements // weight.shape[0])
    if num_items_in_batch is None:
        divisor = (targets != IGNORE_INDEX).sum().to(torch.float32)
    else:
        divisor = torch.as_tensor(num_items_in_batch, device=hidden.device).to(torch.float32)
    return _function().apply(hidden, weight, targets, divisor, rows)


@functools.cache
def _function() -> Any:
    """The autograd Function, made on first use (torch is imported only by a training process)."""
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, hidden: Any, weight: Any, targets: Any, divisor: Any, rows: int) -> Any:
            want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_hidden = torch.empty_like(hidden) if want_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, hidden.shape[0], rows):
                h, t = hidden[start : start + rows], targets[start : start + rows]
                logits = torch.nn.functional.linear(h, weight).float()
                kept = t != IGNORE_INDEX
                picked = torch.where(kept, t, 0).unsqueeze(1)
                log_norm = torch.logsumexp(logits, dim=-1)
                losses = log_norm - logits.gather(1, picked).squeeze(1)
                total += losses.masked_fill(~kept, 0.0).sum()
                if not (want_hidden or want_weight):
                    continue
                # d(loss)/d(logits) of each kept row: softmax minus the one-hot of its target, made
                # in the logits' own memory (one pass, no second chunk of logits).
                grad = logits.sub_(log_norm.unsqueeze(1)).exp_()
                grad.scatter_add_(1, picked, torch.full_like(picked, -1, dtype=grad.dtype))
                if grad.is_cuda:  # no look at the host: asking whether any row is ignored would wait for the GPU
                    grad.masked_fill_(~kept.unsqueeze(1), 0.0)
                elif not bool(kept.all()):  # on a CPU a pass over the chunk costs more than the look
                    grad[~kept] = 0.0
                if want_hidden:
                    grad_hidden[start : start + rows] = grad.to(weight.dtype) @ weight
                if want_weight:
                    grad_weight += grad.t() @ h.to(torch.float32)
            ctx.save_for_backward(grad_hidden, grad_weight, divisor)
            ctx.dtypes = (hidden.dtype, weight.dtype)
            return total / divisor

        @staticmethod
        def backward(ctx: Any, grad_loss: Any) -> Any:
            grad_hidden, grad_weight, divisor = ctx.saved_tensors
            scale = (grad_loss / divisor).to(torch.float32)
            hidden_dtype, weight_dtype = ctx.dtypes
            gh = (grad_hidden * scale).to(hidden_dtype) if grad_hidden is not None else None
            gw = (grad_weight * scale).to(weight_dtype) if grad_weight is not None else None
            return gh, gw, None, None, None

    return ChunkedLinearCrossEntropy


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside a model (under LoRA adapters: the base model)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unfit_reason(model: Any) -> str | None:
    """Why the chunked loss cannot stand in for this model's own, or None when it can."""
    import torch

    lm = causal_lm(model)
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if model_type not in CHUNKED_ARCHITECTURES:
        return f"model type {model_type!r} is not one of {', '.join(sorted(CHUNKED_ARCHITECTURES))}"
    head = getattr(lm, "lm_head", None)
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return "the output layer is not a plain bias-free Linear (LoRA on lm_head, or another head)"
    if not hasattr(lm, "model"):
        return "the model has no decoder attribute `model`"
    return None


def use_chunked_loss(model: Any) -> None:
    """Give the model the chunked loss for forward passes with labels and gradients (training).

    The model's forward becomes a method of its own (a deep copy of the model keeps it, bound to the
    copy); its class and every other model are left as they are."""
    import types

    lm = causal_lm(model)
    lm.forward = types.MethodType(_chunked_forward, lm)


def _chunked_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    position_ids: Any = None,
    past_key_values: Any = None,
    inputs_embeds: Any = None,
    labels: Any = None,
    use_cache: Any = None,
    logits_to_keep: Any = 0,
    **kwargs: Any,
) -> Any:
    """The causal LM's forward with the chunked loss when training; its class's own forward otherwise."""
    import torch
    from transformers.modeling_outputs import CausalLMOutputWithPast

    decoder_inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "past_key_values": past_key_values,
        "inputs_embeds": inputs_embeds,
        "use_cache": use_cache,
    }
    if labels is None or not torch.is_grad_enabled() or logits_to_keep:
        return type(self).forward(self, **decoder_inputs, labels=labels, logits_to_keep=logits_to_keep, **kwargs)
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    kwargs.pop("ignore_index", None)
    outputs = self.model(**decoder_inputs, **kwargs)
    hidden = outputs.last_hidden_state
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    loss = chunked_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        self.lm_head.weight,
        shift_labels.reshape(-1).to(hidden.device),
        num_items_in_batch,
    )
    # No logits: not having them is the point; a caller that needs them runs without labels.
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values)
