"""The embedded default model: a tiny Llama sized for the embedded corpus and a 2-core CPU.

Measured on 2 AMD EPYC cores (torch 2.13 CPU, ``torch.set_num_threads(2)``), plain AdamW,
block 128, batch 16, 100 steps, lr 2e-3 with 10 warmup steps and cosine decay, the default
tokenizer (about 1540 tokens), eval on the whole validation split:

========================  =========  ===========  ========
hidden x layers           params     train (s)    eval ppl
========================  =========  ===========  ========
128 x 4 (this default)    1.25 M     14           5.1-5.5
192 x 3                   2.07 M     21.5         4.3
192 x 4                   2.66 M     25.6         4.6
========================  =========  ===========  ========

The add-one unigram perplexity of the validation split is about 115, so even the smallest
model ends near 0.05x of it (a run of 30 steps ends at 0.6x, of 50 steps at 0.2x): the corpus is
learned well before size matters. 128 x 4 is the default because time is the scarce
resource: two processes sharing the same two cores with one thread each, as two DDP ranks
would, took 25.5 s each against 37 s for 192 x 3, which leaves room within a one-minute
budget for start-up, tokenization (about 2 s), evaluation and checkpointing.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_MAX_STEPS",
    "default_model_config",
]

# Values of the measured run above (per-device batch; 10 % warmup, cosine decay).
DEFAULT_BLOCK_SIZE = 128
DEFAULT_MAX_STEPS = 100
DEFAULT_BATCH_SIZE = 16
DEFAULT_LEARNING_RATE = 2e-3


def default_model_config(vocab_size: int, bos_token_id: int, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    """Keyword arguments for ``transformers.LlamaConfig`` of the tiny default model.

    With the default tokenizer (about 1540 tokens) this is 1.25 M parameters: 4 layers of hidden size
    128 with 4 heads of 32 and an MLP of 512 (the usual 4x), input and output embeddings tied
    (the vocabulary matrix would otherwise be a sixth of the model for no gain at this size).
    """
    return {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
