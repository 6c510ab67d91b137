"""Byte-level BPE tokenizers trained locally, saved as plain Hugging Face tokenizer directories.

A saved directory loads with ``transformers.AutoTokenizer.from_pretrained`` and needs nothing
from supertune. Encoding adds no BOS/EOS: the data pipeline inserts EOS between documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from supertune.embedded.corpus import CORPUS_VERSION, build_once, default_corpus
from supertune.paths import cache_dir

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "cached_tokenizer",
    "default_tokenizer",
    "train_tokenizer",
]

BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN = "<s>", "</s>", "<pad>", "<unk>"
# Ids 0..3 in this order, the usual Llama-style layout.
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN]

# Longest sequence a model trained with these tokenizers is expected to see; only a default
# for truncation warnings, the model config sets the real limit.
MODEL_MAX_LENGTH = 2048


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab_size: int = 4096) -> Path:
    """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts``; save it to ``out_dir``.

    Every byte is in the initial alphabet, so any text encodes without ``<unk>`` and decodes
    back exactly. The vocabulary can come out smaller than ``vocab_size`` when the texts run out
    of pairs worth merging (a small synthetic corpus does).
    """
    tok = Tokenizer(models.BPE())
    # No prefix space: "Hello" and " Hello" stay different tokens and decode(encode(x)) == x.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Imported here: transformers takes about a second to import, which callers that only
    # need the cached path (every run after the first) should not pay.
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        # The default clean-up rewrites " ," to "," etc. and breaks exact round trips.
        clean_up_tokenization_spaces=False,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir


def cached_tokenizer(key: str, texts: Callable[[], Iterable[str]], vocab_size: int = 4096) -> Path:
    """``cache_dir()/tokenizers/<key>-v<vocab_size>/``, trained from ``texts()`` only if missing.

    ``key`` must change whenever the texts change (e.g. carry a corpus version); the cache is
    never invalidated otherwise. Concurrent callers may each train a copy (seconds of CPU);
    the first atomic rename wins and the others discard theirs, so readers never see a
    half-written directory.
    """
    target = cache_dir() / "tokenizers" / f"{key}-v{vocab_size}"
    if target.is_dir():
        return target
    build_once(target, lambda tmp: train_tokenizer(texts(), tmp, vocab_size=vocab_size))
    return target


def _jsonl_texts(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def default_tokenizer() -> Path:
    """The tokenizer of the embedded corpus, trained on its train split (a few seconds, once)."""
    train = default_corpus().train
    return cached_tokenizer(f"corpus-{CORPUS_VERSION}", lambda: _jsonl_texts(train))
