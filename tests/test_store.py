"""The token store on real files: round trip, determinism, corruption, mismatches, and training from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from supertune.cli.main import main

WORDS = "river town alder miller bridge lantern orchard winter harbor stone quiet market".split()


def _doc(i: int) -> str:
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(8 + i % 23)]
    return f"Story {i}: " + " ".join(words) + "."


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("store-data")
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps({"text": _doc(i), "title": f"t{i}"}) + "\n" for i in range(400)))
    valid = root / "valid.jsonl"
    valid.write_text("".join(json.dumps({"text": _doc(1000 + i), "title": f"v{i}"}) + "\n" for i in range(40)))
    return {"train": train, "valid": valid, "root": root}


def _prepare(out: Path, *overrides: str, shard_tokens: int = 1000) -> int:
    return main(["prepare", "--out", str(out), "--shard-tokens", str(shard_tokens), *overrides])


def _tokenizer():
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer

    return AutoTokenizer.from_pretrained(default_tokenizer())


def test_round_trip_gives_the_templated_documents_with_eos_in_order(files, tmp_path):
    from supertune.store.reader import open_store

    out = tmp_path / "store"
    template = "Title {title}. {text}"
    args = [
        f"data.train_files={files['train']}",
        f"data.validation_files={files['valid']}",
        f"data.template={template}",
    ]
    assert _prepare(out, *args) == 0
    store = open_store(out, hashes=True)
    tok = _tokenizer()
    assert store.manifest.dtype == "uint16" and len(store.train.tokens) > 1000  # several shards, documents across them
    assert len(store.manifest.splits["train"].shards) > 2
    for split, path, n in ((store.train, files["train"], 400), (store.validation, files["valid"], 40)):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(split.offsets) == n + 1
        for i, row in enumerate(rows):
            ids = split.document(i)
            assert ids[-1] == tok.eos_token_id
            assert tok.decode(ids[:-1].tolist()) == template.format(**row)
        assert split.offsets[-1] == len(split.tokens)


def test_two_prepares_write_byte_identical_stores(files, tmp_path):
    args = [f"data.train_files={files['train']}", "data.validation_split_percentage=10"]
    assert _prepare(tmp_path / "a", *args) == 0
    assert _prepare(tmp_path / "b", *args) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert "manifest.json" in names and not any(n.startswith(".") for n in names)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["split_rule"] == {
        "validation": "percentage",
        "percentage": 10,
        "seed": 42,
        "max_train_samples": None,
        "max_eval_samples": None,
    }
    assert manifest["sources"]["train"][0]["name"] == "train.jsonl"
    stored = [s["offsets"]["file"] for s in manifest["splits"].values()] + [
        sh["file"] for s in manifest["splits"].values() for sh in s["shards"]
    ]
    assert stored and all("/" not in name for name in stored)  # relative to the store: it can move


@pytest.fixture()
def good_store(files, tmp_path) -> Path:
    out = tmp_path / "store"
    assert _prepare(out, f"data.train_files={files['train']}", f"data.validation_files={files['valid']}") == 0
    return out


def test_verify_accepts_a_good_store(good_store, capsys):
    assert main(["prepare", "--verify", str(good_store)]) == 0
    assert "is sound" in capsys.readouterr().out


def test_a_flipped_byte_is_found_by_sha256(good_store, capsys):
    shard = good_store / "train-00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["prepare", "--verify", str(good_store)]) == 2
    err = capsys.readouterr().err
    assert "train-00001.bin has sha256" in err and "corrupted" in err and len(err.strip().splitlines()) == 1


def test_a_truncated_shard_is_found_by_size(good_store, capsys):
    shard = good_store / "train-00002.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    assert main(["prepare", "--verify", str(good_store)]) == 2
    assert "train-00002.bin has 1998 bytes, the manifest says 2000 (truncated" in capsys.readouterr().err
    from supertune.errors import UserError
    from supertune.store.reader import open_store

    with pytest.raises(UserError, match="truncated"):
        open_store(good_store)  # sizes are checked on every open, without hashing


def test_prepare_refuses_a_non_empty_directory_unless_replacing_a_store(good_store, files, capsys):
    assert _prepare(good_store, f"data.train_files={files['train']}") == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["prepare", "--out", str(good_store), "--force", f"data.train_files={files['train']}"]) == 0


def test_prepare_takes_a_training_config_whose_strategy_is_fsdp_or_zero3(files, tmp_path, capsys):
    """A federated site's run config shards with fsdp (checkpoints refused there today) or zero3:
    tokenizing its data trains nothing, so the strategy's checks do not stop prepare on a CPU machine."""
    data = [f"data.train_files={files['train']}", "data.validation_split_percentage=10"]
    assert _prepare(tmp_path / "fsdp", *data, "distributed.strategy=fsdp") == 0, capsys.readouterr().err
    assert _prepare(tmp_path / "zero3", *data, "distributed.strategy=zero3", "distributed.offload=cpu") == 0
    # The config's own mistakes are still refused, in one line naming the field.
    assert _prepare(tmp_path / "bad", *data, "distributed.strategy=fsdp", "data.block_size=0") == 2
    assert "data.block_size: must be positive" in capsys.readouterr().err


def _train_args(run_dir: Path, files, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files={files['train']}",
        "data.validation_split_percentage=10",
        "data.block_size=32",
        "training.max_steps=4",
        "training.logging_steps=1",
        "training.save_strategy=no",
        "training.per_device_train_batch_size=4",
        "training.report_to=[]",
        "generate.max_new_tokens=0",
        "output.save_model=false",
        *extra,
    ]


def _losses(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if "loss" in x]


def test_training_from_a_store_matches_training_from_the_files(files, tmp_path):
    store = tmp_path / "store"
    assert (
        _prepare(store, f"data.train_files={files['train']}", "data.validation_split_percentage=10", shard_tokens=700)
        == 0
    )
    assert main(_train_args(tmp_path / "raw", files)) == 0
    assert main(_train_args(tmp_path / "stored", files, f"data.store={store}")) == 0
    raw, stored = _losses(tmp_path / "raw"), _losses(tmp_path / "stored")
    assert len(raw) == 4 and len(stored) == 4
    assert max(abs(a - b) for a, b in zip(raw, stored)) <= 1e-6
    a = json.loads((tmp_path / "raw" / "summary.json").read_text())
    b = json.loads((tmp_path / "stored" / "summary.json").read_text())
    assert abs(a["eval_loss"] - b["eval_loss"]) <= 1e-6
    assert a["train_tokens"] == b["train_tokens"]
    assert b["unigram_perplexity"] == pytest.approx(a["unigram_perplexity"], rel=1e-9)


def test_a_store_from_another_tokenizer_or_template_is_refused(good_store, files, tmp_path, capsys):
    common = [f"data.store={good_store}", f"data.validation_files={files['valid']}"]
    assert (
        main(_train_args(tmp_path / "t", files, *common, "model.tokenizer=train", "model.tokenizer_vocab_size=400"))
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1].startswith("supertune: error: data.store:")
        and "tokenizer sha256" in err[-1]
        and "prepare again" in err[-1]
    )
    assert main(_train_args(tmp_path / "u", files, *common, "data.template=Q: {text}", "data.add_eos=false")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.template=None, the run's is 'Q: {text}'" in err and "data.add_eos=True, the run's is False" in err


def test_a_corrupted_store_is_refused_before_training(good_store, files, tmp_path, capsys):
    shard = good_store / "validation-00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01
    shard.write_bytes(bytes(data))
    assert main(_train_args(tmp_path / "c", files, f"data.store={good_store}")) == 2
    err = capsys.readouterr().err
    assert "validation-00000.bin has sha256" in err
    assert not (tmp_path / "c" / "metrics.jsonl").exists()


def test_store_settings_are_checked_with_the_config(tmp_path):
    from supertune.config.errors import ConfigError
    from supertune.resolve import resolve_run_config

    with pytest.raises(ConfigError) as info:
        resolve_run_config(
            None, [f"data.store={tmp_path}", "data.packing=false", f"model.bundle={tmp_path}", "model.tokenizer=gpt2"]
        )
    text = str(info.value)
    assert "data.store: " in text and "no manifest.json" in text
    assert "model.bundle: " in text and "has no offline bundle" in text and "set together with model.tokenizer" in text
    assert "packing" not in text  # padding mode reads a store too


def test_sharded_tokens_slice_like_one_array():
    from supertune.store.reader import ShardedTokens

    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 1000, n).astype("<u2") for n in (5, 0, 17, 1, 9)]
    whole = np.concatenate(parts)
    tokens = ShardedTokens(parts)
    assert len(tokens) == len(whole)
    for start in range(len(whole) + 1):
        for stop in range(start, len(whole) + 2):
            assert np.array_equal(tokens[start:stop], whole[start:stop])
    assert np.shares_memory(tokens[6:10], parts[2])  # inside one shard: a view, no copy


def test_eval_with_data_files_reads_the_files_not_the_store(tmp_path, capsys):
    """A run trained from a store; `eval --data FILE` must evaluate FILE."""
    import json as _json

    from supertune.cli.main import main
    from supertune.embedded import generate_documents

    store = tmp_path / "store"
    assert main(["prepare", "--out", str(store)]) == 0
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--run-dir",
                str(run),
                f"data.store={store}",
                "training.max_steps=1",
                "training.save_strategy=no",
                "generate.max_new_tokens=0",
                "training.report_to=[]",
            ]
        )
        == 0
    )
    other = tmp_path / "other.jsonl"
    other.write_text("".join(_json.dumps({"text": d}) + "\n" for d in generate_documents(99, 40)))
    capsys.readouterr()
    assert main(["eval", str(run / "model")]) == 0
    from_store = capsys.readouterr().out
    assert main(["eval", str(run / "model"), "--data", str(other)]) == 0
    from_file = capsys.readouterr().out
    assert from_store.split("(")[1] != from_file.split("(")[1]  # different sequence counts
