"""data.validation_split (a dataset's validation, else test split, else a held-out share) and
data.sample (the first N documents, or N after a shuffle by the seed), in training and in the token store."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from supertune.cli.main import main
from supertune.config.schema import DataConfig
from supertune.documents.sources import load_raw_splits
from supertune.errors import UserError


def _docs(prefix: str, n: int) -> list[str]:
    return [
        f"{prefix} document {i}: "
        + " ".join(["meadow", "copper", "violet", "anchor", "drift"][(i * k) % 5] for k in range(3 + i % 7))
        for i in range(n)
    ]


def _dataset(root: Path, **splits: int) -> Path:
    """A local dataset directory with one jsonl file per split, as datasets names splits by file name."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in splits.items():
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(split, n)))
    return root


@pytest.fixture(scope="module")
def with_test(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("data") / "with-test", train=120, test=30)


def test_auto_evaluates_on_the_test_split_when_there_is_no_validation_split(with_test, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="supertune"):
        raw = load_raw_splits(DataConfig(dataset_name=str(with_test)), seed=42)
    assert raw.validation_from == "split:test"
    assert list(raw.validation["text"]) == _docs("test", 30) and len(raw.train) == 120
    assert f"data: evaluating on the 'test' split of {with_test} (it has no validation split)" in caplog.text

    both = _dataset(tmp_path / "both", train=50, validation=10, test=20)
    raw = load_raw_splits(DataConfig(dataset_name=str(both)), seed=42)
    assert raw.validation_from == "split:validation" and list(raw.validation["text"]) == _docs("validation", 10)
    raw = load_raw_splits(DataConfig(dataset_name=str(both), validation_split="test"), seed=42)
    assert list(raw.validation["text"]) == _docs("test", 20)

    alone = _dataset(tmp_path / "alone", train=100)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="supertune"):
        raw = load_raw_splits(DataConfig(dataset_name=str(alone)), seed=42)
    assert raw.validation_from == "held_out" and (len(raw.train), len(raw.validation)) == (95, 5)
    assert "has no validation or test split: 5 % of the training data held out for validation (seed 42)" in caplog.text


def test_a_named_split_that_is_not_there_lists_the_splits(with_test):
    with pytest.raises(UserError, match=r"data.validation_split: .* has no split 'valid' \(its splits: train, test\)"):
        load_raw_splits(DataConfig(dataset_name=str(with_test), validation_split="valid"), seed=42)


@pytest.mark.parametrize(("args", "expected"), [
    (["data.validation_split=test"], "data.validation_split: 'test' names a split of data.dataset_name, which is not set"),
    (["data.dataset_name=org/x", "data.validation_split=train"], "data.validation_split: 'train' is the training split"),
    (["data.sample=random"], "data.sample: 'random' is not one of first, shuffled"),
])  # fmt: skip
def test_settings_that_cannot_work_are_refused(capsys, args, expected):
    assert main(["config", "show", *args]) == 2
    assert expected in capsys.readouterr().err


def test_shuffled_sampling_takes_what_shuffle_then_select_takes(with_test):
    """The ULHPC recipe's dataset["train"].shuffle(seed=42).select(range(n)), for both splits."""
    import datasets

    source = datasets.load_dataset(str(with_test))
    raw = load_raw_splits(
        DataConfig(dataset_name=str(with_test), max_train_samples=40, max_eval_samples=8, sample="shuffled"), seed=42
    )
    assert list(raw.train["text"]) == list(source["train"].shuffle(seed=42).select(range(40))["text"])
    assert list(raw.validation["text"]) == list(source["test"].shuffle(seed=42).select(range(8))["text"])
    first = load_raw_splits(DataConfig(dataset_name=str(with_test), max_train_samples=40, max_eval_samples=8), seed=42)
    assert list(first.train["text"]) == _docs("train", 40) and list(first.validation["text"]) == _docs("test", 8)
    other_seed = load_raw_splits(
        DataConfig(dataset_name=str(with_test), max_train_samples=40, sample="shuffled"), seed=7
    )
    assert list(other_seed.train["text"]) != list(raw.train["text"])
    streamed = load_raw_splits(
        DataConfig(dataset_name=str(with_test), max_train_samples=40, sample="shuffled", streaming=True), seed=42
    )
    texts = [row["text"] for row in streamed.train]
    assert len(texts) == 40 and set(texts) <= set(_docs("train", 120)) and texts != _docs("train", 40)


def test_the_token_store_reads_the_same_splits(with_test, tmp_path):
    from supertune.store.reader import open_store

    out = tmp_path / "store"
    args = [
        "prepare",
        "--out",
        str(out),
        f"data.dataset_name={with_test}",
        "data.max_train_samples=40",
        "data.sample=shuffled",
    ]
    assert main(args) == 0
    raw = load_raw_splits(DataConfig(dataset_name=str(with_test), max_train_samples=40, sample="shuffled"), seed=42)
    store = open_store(out, hashes=True)
    assert (len(store.train), len(store.validation)) == (40, 30)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["split_rule"] == {
        "max_train_samples": 40,
        "max_eval_samples": None,
        "sample": "shuffled",
        "seed": 42,
        "validation": "files",
        "validation_split": "auto",
    }
    validation_sources = [f["name"] for f in manifest["sources"]["validation"]]
    assert validation_sources and all("test" in name for name in validation_sources), validation_sources
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer())
    assert [tok.decode(store.train.document(i)[:-1].tolist()) for i in range(3)] == list(raw.train["text"][:3])


@pytest.mark.parametrize(("seed", "streaming"), [(42, False), (7, False), (7, True)])
def test_eval_of_a_saved_model_holds_out_what_its_run_held_out(seed, streaming, tmp_path, capsys):
    """A run held out its own share of the training file (by its seed; a stream: its first
    documents); `supertune eval` of its model evaluates those documents and no others."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs("train", 300)))
    argv = [
        "train",
        f"data.train_files=[{train}]",
        "data.validation_split_percentage=20",
        "data.block_size=32",
        f"data.streaming={str(streaming).lower()}",
        f"training.seed={seed}",
        "training.max_steps=2",
        f"output.runs_root={tmp_path}/runs",
        "generate.max_new_tokens=0",
    ]
    assert main(argv) == 0
    run = next((tmp_path / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(run / "model")]) == 0
    out = capsys.readouterr().out
    printed = float(out.split("eval loss")[1].split()[0])
    assert abs(printed - summary["eval_loss"]) <= 1e-5, (printed, summary["eval_loss"])
    assert f"{summary['eval_tokens']} tokens" in out


def test_a_local_dataset_directory_needs_no_hub(with_test, monkeypatch):
    """A compute node without internet: a local dataset directory loads; a hub name is refused in one line."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # never resolves
    raw = load_raw_splits(DataConfig(dataset_name=str(with_test)), seed=42)
    assert len(raw.train) == 120
    with pytest.raises(UserError, match=r"data.dataset_name: the hub \(https://hub.invalid\) cannot be reached"):
        load_raw_splits(DataConfig(dataset_name="some-org/some-data"), seed=42)
