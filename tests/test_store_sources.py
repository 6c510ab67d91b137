"""Token stores from a cached hub dataset, in padding mode, with data.streaming, and with the offline
bundle (tokenizer and model config in the store, nothing else needed on the compute node)."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import pytest

from supertune.cli.main import main

HUB_ID = "tiny-org/store-corpus"


def _doc(i: int) -> str:
    return f"Record {i}: " + " ".join(
        ["meadow", "copper", "violet", "anchor", "drift"][(i * k) % 5] for k in range(4 + i % 31)
    )


@pytest.fixture(scope="module")
def hub_dataset(tmp_path_factory) -> dict[str, list[str]]:
    """A dataset in the tests' isolated datasets cache, laid out exactly as a download of HUB_ID
    leaves it, so that load_dataset(HUB_ID) finds it offline."""
    import datasets
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.json.json import Json

    root = tmp_path_factory.mktemp("hub-source")
    texts = {"train": [_doc(i) for i in range(300)], "validation": [_doc(5000 + i) for i in range(30)]}
    for split, docs in texts.items():
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    files = DataFilesDict.from_patterns({s: [str(root / f"{s}.jsonl")] for s in texts})
    owner, name = HUB_ID.split("/")
    cache = Path(datasets.config.HF_DATASETS_CACHE) / f"{owner}___{name}"
    shutil.rmtree(cache, ignore_errors=True)
    Json(dataset_name=f"{owner}___{name}", data_files=files, hash="0123abcd").download_and_prepare()
    # A download is cached under config "default" with files named after the dataset alone.
    shutil.move(glob.glob(str(cache / "default-*"))[0], cache / "default")
    for arrow in cache.glob("default/*/*/*.arrow"):
        arrow.rename(arrow.with_name(arrow.name.replace(f"{owner}___{name}-", f"{name}-")))
    return texts


def test_a_cached_hub_dataset_is_a_prepare_source(hub_dataset, tmp_path):
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer
    from supertune.store.reader import open_store

    out = tmp_path / "store"
    assert main(["prepare", "--out", str(out), f"data.dataset_name={HUB_ID}"]) == 0
    store = open_store(out, hashes=True)
    tok = AutoTokenizer.from_pretrained(default_tokenizer())
    for split, texts in ((store.train, hub_dataset["train"]), (store.validation, hub_dataset["validation"])):
        assert len(split) == len(texts)
        for i, text in enumerate(texts):
            ids = split.document(i)
            assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1].tolist()) == text
    m = json.loads((out / "manifest.json").read_text())
    assert m["dataset"] == {"name": HUB_ID, "config": None}
    assert m["split_rule"]["validation"] == "files"  # the dataset's own validation split
    assert [f["name"] for f in m["sources"]["train"]] == ["store-corpus-train.arrow"]


def _train(run_dir: Path, *extra: str) -> list[float]:
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        "training.max_steps=3",
        "training.logging_steps=1",
        "training.save_strategy=no",
        "training.per_device_train_batch_size=4",
        "training.report_to=[]",
        "generate.max_new_tokens=0",
        "output.save_model=false",
        "model.config_overrides=num_hidden_layers=1",
        *extra,
    ]
    assert main(args) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if "loss" in x]


def test_padding_mode_and_streaming_from_a_store_match_the_files(hub_dataset, tmp_path):
    """data.packing=false reads one document per sequence from the store; data.streaming=true reads the
    same memory-mapped store (map-style: shuffled by training.seed, resumable by position)."""
    source = [f"data.dataset_name={HUB_ID}"]
    store = tmp_path / "store"
    assert main(["prepare", "--out", str(store), *source]) == 0
    padded = ["data.packing=false", "data.max_length=24"]
    raw = _train(tmp_path / "raw", *source, *padded)
    stored = _train(tmp_path / "stored", f"data.store={store}", *padded)
    streamed = _train(tmp_path / "streamed", f"data.store={store}", *padded, "data.streaming=true")
    assert len(raw) == 3 and raw == pytest.approx(stored, abs=1e-6) and stored == streamed
    summary = json.loads((tmp_path / "stored" / "summary.json").read_text())
    assert summary["train_tokens"] == json.loads((tmp_path / "raw" / "summary.json").read_text())["train_tokens"]


def test_an_offline_bundle_needs_neither_the_model_directory_nor_the_tokenizer(tmp_path, capsys):
    """prepare --bundle saves the tokenizer and the model's config; a run with model.bundle=STORE
    builds the same model with the model directory gone."""
    from transformers import AutoTokenizer, LlamaConfig

    from supertune.embedded import default_model_config, default_tokenizer

    model_dir = tmp_path / "base-model"
    tok = AutoTokenizer.from_pretrained(default_tokenizer())
    tok.save_pretrained(model_dir)
    config = default_model_config(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None
    )
    LlamaConfig(**{**config, "num_hidden_layers": 1}).save_pretrained(model_dir)
    model = [f"model.name_or_path={model_dir}", "model.from_config=true"]
    store = tmp_path / "store"
    assert main(["prepare", "--out", str(store), "--bundle", *model]) == 0
    manifest = json.loads((store / "manifest.json").read_text())
    bundled = {f["file"] for f in manifest["bundle"]}
    assert {
        "bundle/model/config.json",
        "bundle/tokenizer/tokenizer.json",
        "bundle/tokenizer/tokenizer_config.json",
    } <= bundled
    assert main(["prepare", "--verify", str(store)]) == 0  # bundle files are checked like shards

    with_dir = _train(tmp_path / "a", *model, f"data.store={store}")
    shutil.rmtree(model_dir)
    offline = _train(tmp_path / "b", *model, f"data.store={store}", f"model.bundle={store}")
    assert with_dir == offline
    (store / "bundle" / "model" / "config.json").unlink()
    capsys.readouterr()
    assert main(["train", "--run-dir", str(tmp_path / "c"), *model, f"model.bundle={store}"]) == 2
    err = capsys.readouterr().err
    assert "model.bundle:" in err and "holds no model config" in err


def test_store_check_size_skips_hashing_and_still_catches_truncation(tmp_path):
    """data.store_check=size trusts the bytes (a flipped byte passes) but not the sizes; auto hashes a small store."""
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer
    from supertune.errors import UserError
    from supertune.resolve import resolve_run_config
    from supertune.store.reader import open_store_for_run

    store = tmp_path / "store"
    assert main(["prepare", "--out", str(store), "data.max_train_samples=200", "data.max_eval_samples=20"]) == 0
    shard = store / "train-00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01
    shard.write_bytes(bytes(data))
    tok = AutoTokenizer.from_pretrained(default_tokenizer())
    d = resolve_run_config(None, [f"data.store={store}", "data.store_check=size"]).data
    assert len(open_store_for_run(d, tok).train.tokens) > 0
    d.store_check = "auto"
    with pytest.raises(UserError, match="has sha256"):
        open_store_for_run(d, tok)
    shard.write_bytes(bytes(data[:-2]))
    d.store_check = "size"
    with pytest.raises(UserError, match="truncated"):
        open_store_for_run(d, tok)


def test_text_files_are_read_as_the_datasets_text_builder_reads_them(tmp_path):
    """supertune reads uncompressed .txt files itself; the rows must be exactly those of datasets' text builder."""
    import datasets

    from supertune.documents.sources import _load_files

    cases = {
        "crlf.txt": "first\r\nsecond\r\n\r\nthird",
        "cr.txt": "one\rtwo\r\rthree\n",
        "blank.txt": "\n\n a \n\t\n",
        "unicode.txt": "line\u2028same line\x0bstill\x1cone\n\u00e9t\u00e9\n",
        "empty.txt": "",
        "no-newline.txt": "only",
        "bom.txt": "\ufeffwith a byte order mark\nnext\n",
        "long.txt": ("x" * 70_000 + "\n") * 3,
    }
    for name, text in cases.items():
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    files = {"train": [str(tmp_path / n) for n in cases], "validation": [str(tmp_path / "crlf.txt")]}
    ours = _load_files(files, streaming=False)
    theirs = datasets.load_dataset("text", data_files=files, sample_by="line", cache_dir=str(tmp_path / "cache"))
    for split in files:
        assert ours[split]["text"] == theirs[split]["text"], split
    assert len(ours["train"]) > 12


def test_a_text_file_that_is_not_utf8_is_named_in_one_line(tmp_path):
    from supertune.documents.sources import _load_files
    from supertune.errors import UserError

    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 ok\nna\u00efve\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.txt.*not UTF-8 \(byte 3\)"):
        _load_files({"train": [str(bad)]}, streaming=False)


def test_a_source_that_disappears_before_it_is_hashed_is_named_in_one_line(tmp_path):
    """Sources are hashed on a thread of their own while tokenizing; a file gone by then is a clear error."""
    from supertune.errors import UserError
    from supertune.store.sources import hash_sources

    there = tmp_path / "a.txt"
    there.write_text("text\n")
    assert hash_sources({"train": [str(there)]})["train"][0].size == 5
    with pytest.raises(UserError, match=r"gone\.txt.*sha256.*No such file"):
        hash_sources({"train": [str(there), str(tmp_path / "gone.txt")]})
