"""The precomputed reference log-probabilities kept in the run directory: the stored numbers are the
start model's scoring of the batch the trainer sees (1e-6), a later start with the same start model,
rows and settings reads them without one forward pass, and a store that does not match (damaged
bytes, other rows, another start model, other settings, an unreadable record) is named in one log
line, computed again and written again. A run killed and resumed reads them back:
tests/test_preference_runs.py."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.numpy import load_file

from supertune.train.preference.preference_losses import sequence_logps
from supertune.train.preference.preference_reference import attach_reference
from supertune.train.preference.preference_reference_store import StoredReference
from supertune.training_data.preference_data import PreferenceCollator
from test_preference_losses import TOL, _model, _rows

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from supertune.embedded import default_tokenizer
    from supertune.embedded.chat import EMBEDDED_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    tok.chat_template = EMBEDDED_CHAT_TEMPLATE
    return tok


class Forwards:
    """Counts the real model's forward passes (a hook; the model runs as it is)."""

    def __init__(self, model) -> None:
        self.calls = 0
        model.register_forward_hook(self._count)

    def _count(self, *_: object) -> None:
        self.calls += 1


def _attach(model, rows, tokenizer, store, batch: int = 4) -> int:
    """Forward passes of the model while it attaches the reference of `rows` with `store`."""
    forwards = Forwards(model)
    attach_reference(model, [rows], PreferenceCollator(tokenizer.pad_token_id), batch, CPU, store)
    return forwards.calls


def _live(model, rows, tokenizer, prefix: str = "") -> torch.Tensor:
    """The start model scoring the whole batch the trainer would see (other padding than the precompute's)."""
    batch = PreferenceCollator(tokenizer.pad_token_id)([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        logits = model(input_ids=batch[f"{prefix}input_ids"], attention_mask=batch[f"{prefix}attention_mask"]).logits
    return sequence_logps(logits, batch[f"{prefix}labels"])[0].double()


@pytest.mark.parametrize("unpaired", [False, True], ids=["pairs", "kto"])
def test_the_stored_numbers_are_the_live_references_and_a_later_start_reads_them(tmp_path, tokenizer, caplog, unpaired):
    caplog.set_level(logging.INFO, logger="supertune")
    store = StoredReference(tmp_path / "reference")
    rows = _rows(tokenizer, unpaired)
    assert _attach(_model(tokenizer), rows, tokenizer, store) > 0
    assert "computed once with the start model" in caplog.text
    stored = load_file(str(store.directory / "logps.safetensors"))["split0"]
    record = json.loads((store.directory / "reference.json").read_text())
    assert record["rows"][0]["rows"] == len(rows) and record["settings"] == {"batch_size": 4, "device": "cpu"}

    start = _model(tokenizer)  # built again, as a resumed run builds it: the same seed, the same weights
    if unpaired:
        live = torch.stack([_live(start, rows, tokenizer), _live(start, rows, tokenizer, "kl_")], dim=1)
    else:
        answers = _live(start, rows, tokenizer)
        live = torch.stack([answers[: len(rows)], answers[len(rows) :]], dim=1)
    assert (torch.from_numpy(stored) - live).abs().max() < TOL * max(1.0, float(live.abs().max()))

    caplog.clear()
    again = _rows(tokenizer, unpaired)
    assert _attach(start, again, tokenizer, store) == 0  # read back: no forward pass
    assert "read from" in caplog.text and "computed once" not in caplog.text
    assert (again.reference == stored).all()


def _damage(store: StoredReference) -> None:
    path = store.directory / "logps.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # a byte of the last number
    path.write_bytes(bytes(raw))


MISMATCHES = {
    "damaged bytes": (lambda store, tok: _damage(store), {}, "logps.safetensors is damaged"),
    "other rows": (lambda store, tok: None, {"n": 5}, "computed from other rows of split 0"),
    "another start model": (lambda store, tok: None, {"seed": 1}, "computed from another start model"),
    "other settings": (lambda store, tok: None, {"batch": 2}, "computed with other settings (batch_size 4, device cpu, now batch_size 2"),
    "an unreadable record": (
        lambda store, tok: (store.directory / "reference.json").write_text("{not json"),
        {},
        "reference.json cannot be read",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", MISMATCHES)
def test_a_store_that_does_not_match_is_named_and_computed_again(tmp_path, tokenizer, caplog, case):
    spoil, changed, words = MISMATCHES[case]
    store = StoredReference(tmp_path / "reference")
    _attach(_model(tokenizer), _rows(tokenizer, False), tokenizer, store)
    spoil(store, tokenizer)

    caplog.set_level(logging.INFO, logger="supertune")
    model, rows = _model(tokenizer, changed.get("seed", 0)), _rows(tokenizer, False, changed.get("n", 6))
    assert _attach(model, rows, tokenizer, store, changed.get("batch", 4)) > 0
    [line] = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert words in line and line.endswith("computing them again"), line
    answers = _live(model, rows, tokenizer)
    live = torch.stack([answers[: len(rows)], answers[len(rows) :]], dim=1)
    assert (torch.from_numpy(rows.reference) - live).abs().max() < TOL * max(1.0, float(live.abs().max()))

    caplog.clear()  # written again: the next start with the same model and rows reads them
    assert _attach(model, _rows(tokenizer, False, changed.get("n", 6)), tokenizer, store, changed.get("batch", 4)) == 0
    assert "not used" not in caplog.text


def test_a_process_that_does_not_write_leaves_the_store_to_the_main_one(tmp_path, tokenizer):
    store = StoredReference(tmp_path / "reference", writes=False)
    rows = _rows(tokenizer, False)
    _attach(_model(tokenizer), rows, tokenizer, store)
    assert rows.reference is not None and not store.directory.exists()
