"""The embedded default: corpus, tokenizer, model config and unigram baseline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supertune.embedded import (
    DefaultCorpus,
    cached_tokenizer,
    default_corpus,
    default_model_config,
    generate_documents,
    train_tokenizer,
    unigram_perplexity,
)
from supertune.embedded.corpus import publish_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SUPERTUNE_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def small_texts() -> list[str]:
    return generate_documents(seed=7, n_docs=150)


def _leftovers(directory: Path) -> list[str]:
    """Names of half-built temporary directories (they start with a dot)."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- corpus ------------------------------------------------------------------------------


def test_generate_documents_is_deterministic_per_seed() -> None:
    a = generate_documents(seed=3, n_docs=40)
    assert a == generate_documents(seed=3, n_docs=40)
    b = generate_documents(seed=4, n_docs=40)
    assert not set(a) & set(b)
    lengths = [len(d.split()) for d in a + b]
    assert min(lengths) >= 40 and max(lengths) <= 450
    assert max(lengths) - min(lengths) > 150, "lengths should vary so that packing matters"


def test_documents_keep_their_facts_consistent() -> None:
    # Each document fixes where its landmarks lie; every later mention must agree.
    checked = 0
    for doc in generate_documents(seed=11, n_docs=30):
        seen: dict[str, str] = {}
        words = doc.replace(".", " ").replace("?", " ").split()
        for i in range(len(words) - 6):
            is_fact = words[i + 2] == "is" and words[i + 4 : i + 7] == ["of", "the", "town"]
            if words[i].lower() == "the" and is_fact:
                landmark, direction = words[i + 1], words[i + 3]
                assert seen.setdefault(landmark, direction) == direction, doc
                checked += 1
    assert checked > 100


def test_default_corpus_files(cache: Path) -> None:
    corpus = default_corpus()
    folder = cache / "corpus-v1"
    assert corpus == DefaultCorpus(folder / "train.jsonl", folder / "validation.jsonl")
    assert 2_500_000 < corpus.train.stat().st_size < 3_500_000
    assert 100_000 < corpus.validation.stat().st_size < 200_000
    train, validation = (
        [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
        for path in (corpus.train, corpus.validation)
    )
    assert all(isinstance(t, str) and t for t in train + validation)
    assert not set(train) & set(validation)
    assert _leftovers(cache) == []

    mtime = corpus.train.stat().st_mtime_ns
    assert default_corpus() == corpus
    assert corpus.train.stat().st_mtime_ns == mtime, "a built corpus must be reused, not rewritten"


def test_default_corpus_same_bytes_in_any_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    for name in ("one", "two"):
        monkeypatch.setenv("SUPERTUNE_CACHE", str(tmp_path / name))
        corpus = default_corpus()
        built.append((corpus.train.read_bytes(), corpus.validation.read_bytes()))
    assert built[0] == built[1]


# -- tokenizer ---------------------------------------------------------------------------


ROUND_TRIP = [
    "Mara walks north to the mill.",
    "  leading spaces , odd spacing ;and trailing  ",
    'Line one.\nLine two,\ttabbed. "Quoted," she says.',
    "Ünïcode: naïve café, 日本語, emoji 🙂, symbols ✓ ≤ ∞",
    "",
]


def test_trained_tokenizer_loads_and_round_trips(tmp_path: Path, small_texts: list[str]) -> None:
    from transformers import AutoTokenizer

    out = train_tokenizer(small_texts, tmp_path / "tok", vocab_size=512)
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert "supertune" not in json.dumps(config)

    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    ids = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    assert None not in ids and len(ids) == 3
    assert tok.model_max_length == 2048
    assert 300 < len(tok) <= 512

    for text in ROUND_TRIP + small_texts[:5]:
        encoded = tok(text)["input_ids"]
        assert tok.decode(encoded) == text
        assert tok.bos_token_id not in encoded and tok.eos_token_id not in encoded
    # BPE learned the corpus's words: a sentence costs far fewer tokens than bytes.
    assert len(tok("The river is north of the town.")["input_ids"]) <= 10


def test_cached_tokenizer_trains_once(cache: Path, small_texts: list[str]) -> None:
    calls = 0

    def texts() -> list[str]:
        nonlocal calls
        calls += 1
        return small_texts

    first = cached_tokenizer("unit", texts, vocab_size=400)
    assert first == cache / "tokenizers" / "unit-v400"
    assert (first / "tokenizer.json").is_file() and calls == 1
    mtime = (first / "tokenizer.json").stat().st_mtime_ns
    assert cached_tokenizer("unit", texts, vocab_size=400) == first
    assert calls == 1 and (first / "tokenizer.json").stat().st_mtime_ns == mtime
    assert cached_tokenizer("unit", texts, vocab_size=300) != first and calls == 2
    assert _leftovers(cache / "tokenizers") == []


def test_cached_tokenizer_keeps_the_copy_published_first(cache: Path, small_texts: list[str]) -> None:
    # Another process finishes while this one is still training: its copy must win, ours
    # must be thrown away without error.
    target = cache / "tokenizers" / "race-v400"

    def texts() -> list[str]:
        target.mkdir(parents=True)
        (target / "winner").write_text("other process")
        return small_texts

    assert cached_tokenizer("race", texts, vocab_size=400) == target
    assert sorted(p.name for p in target.iterdir()) == ["winner"]
    assert _leftovers(target.parent) == []


def test_publish_dir_moves_or_yields(tmp_path: Path) -> None:
    first, second, target = tmp_path / "a", tmp_path / "b", tmp_path / "target"
    for d, tag in ((first, "first"), (second, "second")):
        d.mkdir()
        (d / "tag").write_text(tag)
    publish_dir(first, target)
    assert (target / "tag").read_text() == "first" and not first.exists()
    publish_dir(second, target)
    assert (target / "tag").read_text() == "first"
    with pytest.raises(OSError):
        publish_dir(tmp_path / "missing", tmp_path / "elsewhere")


_RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from supertune.embedded import default_corpus, default_tokenizer
    gate = Path(sys.argv[1])
    deadline = time.monotonic() + 30
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    corpus = default_corpus()
    print(corpus.train, default_tokenizer())
    """
)


def test_concurrent_builds_agree(cache: Path, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(gate)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for _ in range(2)
    ]
    time.sleep(0.3)  # let both finish importing, then release them together
    gate.touch()
    results = [p.communicate(timeout=60) for p in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err
    outputs = {out.strip() for out, _ in results}
    assert len(outputs) == 1, outputs

    assert sorted(p.name for p in cache.iterdir()) == ["corpus-v1", "tokenizers"]
    assert sorted(p.name for p in (cache / "tokenizers").iterdir()) == ["corpus-v1-v4096"]
    assert sorted(p.name for p in (cache / "corpus-v1").iterdir()) == ["train.jsonl", "validation.jsonl"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cache / "tokenizers" / "corpus-v1-v4096")
    text = json.loads((cache / "corpus-v1" / "validation.jsonl").open().readline())["text"]
    assert tok.decode(tok(text)["input_ids"]) == text


# -- model -------------------------------------------------------------------------------


def test_default_model_config_builds_a_tiny_llama() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = default_model_config(vocab_size=1540, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    config = LlamaConfig(**kwargs)
    ids = (config.bos_token_id, config.eos_token_id, config.pad_token_id)
    assert config.vocab_size == 1540 and ids == (0, 1, 2)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert 500_000 < params < 5_000_000


# -- baseline ----------------------------------------------------------------------------


def test_unigram_perplexity_by_hand() -> None:
    # counts [1, 2, 1, 0] over 4 tokens, vocabulary 4: p = [2, 3, 2, 1] / 8.
    # eval tokens 1 and 3: ppl = exp(-(ln 3/8 + ln 1/8) / 2) = 8 / sqrt(3).
    got = unigram_perplexity([[0, 1, 1], [2]], [[1], [3]], vocab_size=4)
    assert got == pytest.approx(8 / math.sqrt(3), rel=1e-12)
    # Without training data every token has probability 1/V.
    assert unigram_perplexity([], [[0, 5, 9]], vocab_size=10) == pytest.approx(10.0)


def test_unigram_perplexity_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        unigram_perplexity([[0]], [], vocab_size=4)
    with pytest.raises(ValueError):
        unigram_perplexity([[0, 4]], [[1]], vocab_size=4)
    with pytest.raises(ValueError):
        unigram_perplexity([[0]], [[-1]], vocab_size=4)
