"""Loss and perplexity of a saved model, computed exactly as a training run's final evaluation."""

from __future__ import annotations

import math
from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError
from ..training_data.pipeline import build_eval_dataset

__all__ = ["load_saved_model", "evaluate_saved_model"]


def load_saved_model(model_dir: str, verify: str = "auto", tokenizer_ref: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face model directory, in the dtype it was saved in.

    The directory is checked first (config.json, the weight files' headers, its manifest by
    `verify`: see supertune.checkpoints.manifest.VERIFY_MODES), and the tokenizer after loading: it
    must encode text, into ids the model has embedding rows for. `tokenizer_ref` (model.tokenizer:
    a directory or hub id) is the tokenizer instead of the model directory's own, which then need
    not have one (a base model saved without it, as the two-site Llama recipe's).
    """
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..checkpoints.model_files import check_saved_model
    from ..modeling.load_errors import model_load_errors
    from ..modeling.tokenizer import token_id_limit, tokenizer_problem

    if not os.path.isdir(model_dir):
        raise UserError(f"MODEL: {model_dir!r} is not a directory; give a saved model such as runs/<run>/model")
    check_saved_model(model_dir, "MODEL", verify, tokenizer=tokenizer_ref is None)
    source, field, local_only = model_dir, "MODEL", True
    if tokenizer_ref is not None:
        from ..hub import resolve_reference

        resolved = resolve_reference(tokenizer_ref, "model.tokenizer", "tokenizer_config.json")
        source, field, local_only = resolved.ref, "model.tokenizer", resolved.local_files_only
    with model_load_errors(field, source):
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    with model_load_errors("MODEL", model_dir):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", local_files_only=True)
    fix = (
        "save the model with its tokenizer"
        if tokenizer_ref is None
        else "give the tokenizer the model was trained with"
    )
    problem = tokenizer_problem(tokenizer)
    if problem:
        raise UserError(f"{field}: the tokenizer of {source!r} {problem}; {fix}")
    rows, limit = model.get_input_embeddings().weight.shape[0], token_id_limit(tokenizer)
    if limit > rows:
        raise UserError(
            f"{field}: the tokenizer of {source!r} has ids up to {limit - 1} but the model has {rows} embedding rows: "
            f"it is not the tokenizer this model was trained with; {fix}"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def evaluate_saved_model(model_dir: str, cfg: RunConfig, verify: str = "auto") -> dict[str, float]:
    """eval_loss, perplexity, sequences and tokens, on cfg.data batched as in training (the run's exact final eval):
    over the tokens data.loss_on names (the answers of conversations and prompt/completion rows), with
    cfg.model.tokenizer when it is set (not "train"), else the model directory's own tokenizer."""
    from transformers import default_data_collator

    from ..modeling.model import context_length
    from .loss import token_mean_loss

    tokenizer_ref = cfg.model.tokenizer if cfg.model.tokenizer not in (None, "train") else None
    model, tokenizer = load_saved_model(model_dir, verify, tokenizer_ref)
    if cfg.data.format == "chat":
        from ..conversations.template import attach_chat_template

        attach_chat_template(cfg.data, tokenizer, tokenizer_ref or model_dir, own_tokenizer=False)
    dataset, collator = build_eval_dataset(cfg.data, tokenizer, context_length(model), cfg.training.seed)
    loss, tokens = token_mean_loss(
        model, dataset, collator or default_data_collator, cfg.training.per_device_eval_batch_size
    )
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "sequences": len(dataset), "tokens": tokens}
