"""training.float8: the decoder layers' matmuls in float8 through torchao's float8 training.

torchao's `convert_to_float8_training` swaps chosen `nn.Linear` modules for its `Float8Linear`,
which casts the input, the weight and the output's gradient to float8 (dynamic per-tensor scales) for
the three matmuls of each forward and backward and keeps the weight and the optimizer in the model's
own precision. It is not bit-exact, so it is its own setting, never taken by `training.speed: auto`.

It needs matmuls in float8 (`torch._scaled_mm`): CUDA compute capability 8.9 or above (Ada, Hopper
and newer). On any other device the run is refused in one line before anything is built
(`refuse_float8_device`, called by `supertune train` before the run directory exists and again by
every training process). torchao is imported only here, only when the setting is on.
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from .decoder_layers import decoder_layers

__all__ = ["FLOAT8_MIN_CAPABILITY", "float8_device_problem", "float8_linears", "refuse_float8_device", "use_float8"]

FLOAT8_MIN_CAPABILITY = (8, 9)
"""The lowest CUDA compute capability with float8 tensor-core matmuls (Ada; Hopper is 9.0)."""

_DIVISOR = 16
"""torch._scaled_mm needs both dimensions of the weight to be multiples of 16."""


def float8_device_problem(device: str, name: str = "", capability: tuple[int, int] | None = None) -> str | None:
    """The one-line refusal of training.float8 on `device` ("cuda" or "cpu"), or None where it can run."""
    if device == "cuda" and capability is not None and capability >= FLOAT8_MIN_CAPABILITY:
        return None
    here = (
        "CPU" if device != "cuda" else f"{name or 'a GPU'} (compute capability {'.'.join(map(str, capability or ()))})"
    )
    return (
        "training.float8: needs a GPU with float8 matmuls (H100/H200, Ada: compute capability >= "
        f"{FLOAT8_MIN_CAPABILITY[0]}.{FLOAT8_MIN_CAPABILITY[1]}); this run is on {here}: remove training.float8"
    )


def refuse_float8_device() -> None:
    """UserError with the fix when this process's device has no float8 matmuls."""
    import torch

    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        problem = float8_device_problem(
            "cuda", torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))
        )
    else:
        problem = float8_device_problem("cpu")
    if problem:
        raise UserError(problem)


def float8_linears(model: Any) -> dict[int, str]:
    """The modules float8 converts, by id: each decoder layer's `nn.Linear` (attention projections,
    the MLP) whose dimensions are multiples of 16.

    Not the output layer: its logits feed the softmax over the whole vocabulary, where float8's
    3 significant bits would show in the loss (torchtitan leaves it out too), and the chunked loss
    multiplies by its weight directly, past the module's forward. Not the embeddings: a lookup, no
    matmul. Outside the decoder layers nothing else is a matmul worth converting."""
    import torch

    found: dict[int, str] = {}
    for index, layer in enumerate(decoder_layers(model)):
        for name, module in layer.named_modules():
            if type(module) is torch.nn.Linear and _fits(module):
                found[id(module)] = f"layers.{index}.{name}"
    return found


def _fits(linear: Any) -> bool:
    return linear.in_features % _DIVISOR == 0 and linear.out_features % _DIVISOR == 0


def use_float8(model: Any) -> int:
    """Swap float8_linears(model) for torchao's Float8Linear in place; returns how many were swapped."""
    from torchao.float8 import convert_to_float8_training

    chosen = float8_linears(model)
    convert_to_float8_training(model, module_filter_fn=lambda module, fqn: id(module) in chosen)
    return len(chosen)
