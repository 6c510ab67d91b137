"""The embedded default that works offline: a synthetic corpus, its tokenizer, a tiny Llama."""

from supertune.defaults.baseline import unigram_perplexity
from supertune.defaults.corpus import DefaultCorpus, default_corpus, generate_documents
from supertune.defaults.model import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_STEPS,
    default_model_config,
)
from supertune.defaults.tokenizer import cached_tokenizer, default_tokenizer, train_tokenizer

__all__ = [
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
