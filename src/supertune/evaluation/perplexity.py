"""Loss and perplexity of a saved model, computed exactly as a training run's final evaluation."""

from __future__ import annotations

import math
from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError
from ..training_data.pipeline import build_eval_dataset

__all__ = ["load_saved_model", "evaluate_saved_model"]


def load_saved_model(model_dir: str, verify: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face model directory, in the dtype it was saved in.

    The directory is checked first (config.json, the weight files' headers, its manifest by
    `verify`: see supertune.checkpoints.manifest.VERIFY_MODES), and the tokenizer after loading: it
    must encode text, into ids the model has embedding rows for.
    """
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..checkpoints.model_files import check_saved_model
    from ..modeling.load_errors import model_load_errors
    from ..modeling.tokenizer import token_id_limit, tokenizer_problem

    if not os.path.isdir(model_dir):
        raise UserError(f"MODEL: {model_dir!r} is not a directory; give a saved model such as runs/<run>/model")
    check_saved_model(model_dir, "MODEL", verify, tokenizer=True)
    with model_load_errors("MODEL", model_dir):
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", local_files_only=True)
    problem = tokenizer_problem(tokenizer)
    if problem:
        raise UserError(f"MODEL: the tokenizer of {model_dir!r} {problem}; save the model with its tokenizer")
    rows, limit = model.get_input_embeddings().weight.shape[0], token_id_limit(tokenizer)
    if limit > rows:
        raise UserError(
            f"MODEL: the tokenizer of {model_dir!r} has ids up to {limit - 1} but the model has {rows} embedding rows: "
            "it is not the tokenizer this model was trained with; save the model with its own tokenizer"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def evaluate_saved_model(model_dir: str, cfg: RunConfig, verify: str = "auto") -> dict[str, float]:
    """eval_loss, perplexity, sequences and tokens, on cfg.data batched as in training (the run's exact final eval):
    over the tokens data.loss_on names (the answers of conversations and prompt/completion rows)."""
    from transformers import default_data_collator

    from ..modeling.model import context_length
    from .loss import token_mean_loss

    model, tokenizer = load_saved_model(model_dir, verify)
    if cfg.data.format == "chat":
        from ..conversations.template import attach_chat_template

        attach_chat_template(cfg.data, tokenizer, model_dir, own_tokenizer=False)
    dataset, collator = build_eval_dataset(cfg.data, tokenizer, context_length(model), cfg.training.seed)
    loss, tokens = token_mean_loss(
        model, dataset, collator or default_data_collator, cfg.training.per_device_eval_batch_size
    )
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "sequences": len(dataset), "tokens": tokens}
