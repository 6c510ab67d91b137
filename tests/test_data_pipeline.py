"""The data pipeline on real files: every format, templates, validation split, packing and padding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from supertune.documents.encoding import render_texts
from supertune.documents.sources import load_raw_splits
from supertune.errors import UserError
from supertune.resolve import resolve_run_config
from supertune.training_data.batches import IGNORE_INDEX, PadCollator
from supertune.training_data.pipeline import build_training_data

DOCS = [f"Document number {i} talks about the river and the town of Alder." * (1 + i % 4) for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer())
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    return tok


def _write(tmp_path, fmt):
    if fmt == "txt":
        path = tmp_path / "train.txt"
        path.write_text("\n".join(DOCS) + "\n")
    elif fmt == "jsonl":
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    elif fmt == "json":
        path = tmp_path / "train.json"
        path.write_text(json.dumps([{"text": d} for d in DOCS]))
    elif fmt == "csv":
        import csv

        path = tmp_path / "train.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([[d] for d in DOCS])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "train.parquet"
        pq.write_table(pa.table({"text": DOCS}), path)
    return path


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "json", "csv", "parquet"])
def test_every_file_format_loads_and_splits(tmp_path, fmt):
    path = _write(tmp_path, fmt)
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.validation_split_percentage=10"])
    raw = load_raw_splits(cfg.data, seed=1)
    assert len(raw.train) + len(raw.validation) == len(DOCS)
    assert len(raw.validation) == 6
    texts = set(raw.train["text"]) | set(raw.validation["text"])
    assert texts == set(DOCS)


def test_glob_and_list_of_files(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "alpha"}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "beta"}) + "\n")
    cfg = resolve_run_config(
        None, [f"data.train_files={tmp_path}/*.jsonl", f"data.validation_files=[{tmp_path}/a.jsonl]"]
    )
    assert cfg.data.train_files == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    raw = load_raw_splits(cfg.data, seed=0)
    assert sorted(raw.train["text"]) == ["alpha", "beta"]
    assert raw.validation["text"] == ["alpha"]


def test_template_uses_columns():
    cfg = resolve_run_config(None, ["data.template=Write a document about {topic}: {text}"])
    rows = {"text": ["Rivers flow.", "", None], "topic": ["water", "", None]}
    assert render_texts(rows, cfg.data) == ["Write a document about water: Rivers flow."]


def test_template_naming_a_missing_column_is_refused(tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.template=Q: {question}"])
    with pytest.raises(UserError, match=r"data.template: column 'question' is not in the data \(columns: text, id\)"):
        load_raw_splits(cfg.data, seed=0)


def test_packing_yields_full_blocks_without_pad_tokens(tokenizer):
    cfg = resolve_run_config(None, ["data.block_size=64"])
    data = build_training_data(cfg.data, tokenizer, seed=0, context_length=1024)
    assert len(data.train) > 100
    eos_seen = 0
    for i in range(len(data.train)):
        item = data.train[i]
        ids = item["input_ids"]
        assert ids.shape == (64,)
        assert not (ids == tokenizer.pad_token_id).any()
        assert (item["labels"] == ids).all()
        eos_seen += int((ids == tokenizer.eos_token_id).sum())
    assert eos_seen > 0  # documents are separated by EOS
    # The blocks are exactly the concatenated stream, in order.
    stream = np.concatenate([data.train[i]["input_ids"].numpy() for i in range(3)])
    assert (stream[:64] == data.train.tokens[:64]).all()


def test_padding_mode_pads_to_max_length_and_masks_the_loss(tokenizer, tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.packing=false", "data.max_length=32"])
    data = build_training_data(cfg.data, tokenizer, seed=0, context_length=1024)
    batch = data.collator([data.train[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 32)
    pads = batch["attention_mask"] == 0
    assert (batch["labels"][pads] == IGNORE_INDEX).all()
    assert (batch["input_ids"][pads] == tokenizer.pad_token_id).all()
    assert (batch["labels"][~pads] == batch["input_ids"][~pads]).all()


def test_padding_without_max_length_uses_the_longest_document(tokenizer, tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.packing=false"])
    data = build_training_data(cfg.data, tokenizer, seed=0, context_length=1024)
    longest = max(len(d) for d in data.train.docs)
    assert data.max_length == longest
    assert isinstance(data.collator, PadCollator)


def test_streaming_packs_blocks(tokenizer, tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = resolve_run_config(
        None,
        [
            f"data.train_files={path}",
            f"data.validation_files={path}",
            "data.streaming=true",
            "data.block_size=16",
            "training.max_steps=3",
        ],
    )
    data = build_training_data(cfg.data, tokenizer, seed=0, context_length=1024)
    blocks = [b["input_ids"] for _, b in zip(range(5), iter(data.train))]
    assert len(blocks) == 5 and all(b.shape == (16,) for b in blocks)
    assert data.unigram_perplexity is None


def test_a_stream_too_small_for_one_block_is_a_clear_error(tokenizer, tmp_path):
    path = _write(tmp_path, "jsonl")
    # without validation files the first documents of the stream are held out: here, all of them
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.streaming=true", "training.max_steps=3"])
    data = build_training_data(cfg.data, tokenizer, seed=0, context_length=1024)
    with pytest.raises(UserError, match="less than one block"):
        next(iter(data.train))


def test_block_larger_than_the_data_is_a_clear_error(tokenizer, tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"text": f"tiny {i}"}) + "\n" for i in range(10)))
    cfg = resolve_run_config(None, [f"data.train_files={path}", "data.block_size=1024"])
    with pytest.raises(UserError, match="data.block_size: the training split has"):
        build_training_data(cfg.data, tokenizer, seed=0, context_length=8192)


def _ordinary_ids(tok, texts):
    eos = tok.eos_token_id
    return [x + [eos] for x in tok(texts, add_special_tokens=False)["input_ids"]]


def test_encoding_in_threads_gives_the_tokenizers_own_ids_in_order(tokenizer, monkeypatch):
    """Batches finish out of order on several threads; every batch must come back with its own ids, in order."""
    from supertune.documents.encode_threads import encode_in_threads

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    texts = [d + f" caf\u00e9 {'x' * (i % 7)} \u2028 {i}" for i, d in enumerate(DOCS * 5)]
    batches = [(i, texts[i * 7 : i * 7 + 7 - i % 3]) for i in range(len(texts) // 7)] + [(-1, [])]
    got = list(encode_in_threads(iter(batches), tokenizer, add_eos=True, threads=3))
    assert [tag for tag, _, _ in got] == [tag for tag, _ in batches]
    for (tag, flat, lengths), (_, batch) in zip(got, batches):
        expected = _ordinary_ids(tokenizer, batch) if batch else []
        assert lengths.tolist() == [len(x) for x in expected], tag
        assert flat.tolist() == [t for x in expected for t in x], tag
    assert (flat.dtype, lengths.dtype) == (np.int32, np.int64)
    assert __import__("os").environ["TOKENIZERS_PARALLELISM"] == "true"  # the tokenizer's own threads are on again


def test_a_tokenizer_that_rewrites_text_in_python_is_called_as_itself(tokenizer):
    """Only a tokenizer whose backend alone gives its ids is encoded on the backend; others keep their own call."""
    from transformers import PreTrainedTokenizerFast

    from supertune.documents.encode_threads import encode_in_threads

    class Shouting(PreTrainedTokenizerFast):
        def __call__(self, text, *args, **kwargs):
            upper = [t.upper() for t in text] if isinstance(text, list) else text.upper()
            return super().__call__(upper, *args, **kwargs)

    shouting = Shouting(tokenizer_object=tokenizer.backend_tokenizer, eos_token=tokenizer.eos_token)
    batches = [(0, DOCS[:5]), (1, DOCS[5:9])]
    got = list(encode_in_threads(iter(batches), shouting, add_eos=True, threads=2))
    for (_, flat, _), (_, batch) in zip(got, batches):
        assert flat.tolist() == [t for x in _ordinary_ids(tokenizer, [d.upper() for d in batch]) for t in x]
