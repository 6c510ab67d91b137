"""Which tensors `save_pretrained` writes for a model, and under which names, from its config.json alone.

A model's state dict names every tensor, tied ones under each of their names (a tied Llama's
`lm_head.weight` is its `model.embed_tokens.weight`). save_pretrained leaves out the model's
`_keys_to_ignore_on_save` and, of each group of tied names, all but the one the model expects when
it loads (transformers' `remove_tied_weights_from_state_dict`, called here as save_pretrained calls
it). A reader of a state dict stored another way (an FSDP run's sharded checkpoint, keyed by the
state dict's names) asks this module what a saved model of it holds.

The model is built on the meta device from the config: no memory for weights; the cost is importing
transformers and building the module tree, a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import first_line

__all__ = ["SavedTensors", "saved_tensors"]


@dataclass(frozen=True)
class SavedTensors:
    """The state dict of a model built from a config, and what save_pretrained keeps of it."""

    kept: dict[str, tuple[int, ...]]
    """Name -> shape of every tensor save_pretrained writes, in the state dict's order."""
    left_out: tuple[str, ...]
    """State-dict names it does not write: the other names of tied tensors, the keys ignored on save."""


def saved_tensors(config_dir: Path) -> SavedTensors:
    """What save_pretrained writes for a causal LM of config_dir/config.json. ValueError saying why when
    the model cannot be built from it here (custom code, an unknown model type) or when save_pretrained
    would convert its weights into another layout (fused experts and the like), which a reader going
    tensor by tensor cannot reproduce."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    try:
        config = AutoConfig.from_pretrained(str(config_dir))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        raise ValueError(f"its config.json does not build a model here ({first_line(exc)})") from None
    state = model.state_dict()
    every = list(state)
    for name in model._keys_to_ignore_on_save or ():
        state.pop(name, None)
    state = remove_tied_weights_from_state_dict(state, model)
    kept = {name: tuple(int(x) for x in tensor.shape) for name, tensor in state.items()}
    reverted = revert_weight_conversion(model, dict(state))
    if {n: tuple(t.shape) for n, t in reverted.items()} != kept:
        raise ValueError(
            f"save_pretrained converts the weights of model_type {config.model_type} into another layout, "
            "which is not read a tensor at a time"
        )
    return SavedTensors(kept, tuple(n for n in every if n not in kept))
