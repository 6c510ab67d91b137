"""The embedded default that works offline: a synthetic corpus, its tokenizer, a tiny Llama.

Names are imported from their modules when first used, so that `supertune.embedded.model` (plain
numbers, read by config validation on a login node) does not bring in numpy and tokenizers.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "EMBEDDED_CHAT_TEMPLATE",
    "chat_corpus",
    "sample_conversation",
    "preference_corpus",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_MAX_STEPS",
    "DefaultCorpus",
    "cached_tokenizer",
    "default_corpus",
    "default_model_config",
    "default_tokenizer",
    "generate_documents",
    "train_tokenizer",
    "unigram_perplexity",
]

_WHERE = {
    "EMBEDDED_CHAT_TEMPLATE": "chat",
    "chat_corpus": "chat",
    "sample_conversation": "chat",
    "preference_corpus": "preference",
    "unigram_perplexity": "baseline",
    "DefaultCorpus": "corpus",
    "default_corpus": "corpus",
    "generate_documents": "corpus",
    "DEFAULT_BATCH_SIZE": "model",
    "DEFAULT_BLOCK_SIZE": "model",
    "DEFAULT_LEARNING_RATE": "model",
    "DEFAULT_MAX_STEPS": "model",
    "default_model_config": "model",
    "cached_tokenizer": "tokenizer",
    "default_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
