"""Loss and perplexity of a saved model, computed exactly as a training run's final evaluation."""

from __future__ import annotations

import math
from typing import Any

from ..config.schema import RunConfig
from ..data.pipeline import build_eval_dataset
from ..errors import UserError

__all__ = ["load_saved_model", "evaluate_saved_model"]


def load_saved_model(model_dir: str) -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face model directory, in the dtype it was saved in."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(model_dir):
        raise UserError(f"MODEL: {model_dir!r} is not a directory; give a saved model such as runs/<run>/model")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"MODEL: cannot load {model_dir!r}: {str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def evaluate_saved_model(model_dir: str, cfg: RunConfig) -> dict[str, float]:
    """eval_loss, perplexity, sequences and tokens, on cfg.data batched as in training (the run's exact final eval)."""
    from transformers import default_data_collator

    from ..modeling.model import context_length
    from .loss import token_mean_loss

    model, tokenizer = load_saved_model(model_dir)
    dataset, collator = build_eval_dataset(cfg.data, tokenizer, context_length(model))
    loss, tokens = token_mean_loss(model, dataset, collator or default_data_collator, cfg.training.per_device_eval_batch_size)
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "sequences": len(dataset), "tokens": tokens}
