"""A federation's receipts, damaged or pointing elsewhere: a missing or mistyped field is one line naming
the file, the damage and the fix; a training receipt whose checkpoint is another site's, or is gone, is
refused before an average builds on it."""

from __future__ import annotations

import json
import shutil

import pytest

from average_models import make_checkpoint, save_model
from supertune.errors import UserError
from supertune.federation.receipts import checked_checkpoint, read_receipt

TRAINED = {
    "site": "a", "round": 1, "run": "/r", "checkpoint": "/r/c", "step": 10, "tokens": 100, "samples": 4,
    "eval_loss": 2.5, "seconds": 1.0,
}  # fmt: skip
AVERAGED = {"round": 1, "global_model": "/g", "weights": {"a": 0.5, "b": 0.5}, "tokens": {"a": 1, "b": 1}}
DAMAGE = [
    ("trained.json", {k: v for k, v in TRAINED.items() if k != "tokens"}, "no tokens"),
    ("trained-a.json", {**TRAINED, "round": "1"}, "round is '1', not a whole number"),
    ("averaged.json", {**AVERAGED, "weights": [0.5, 0.5]}, "weights is [0.5, 0.5], not an object"),
    ("averaged.json", {**AVERAGED, "weights": {"a": "half"}}, "the weight of a is 'half', not a number"),
    ("evaluated.json", {"eval_loss": "2.5"}, "eval_loss is '2.5', not a number"),
]


@pytest.mark.parametrize(("name", "record", "damage"), DAMAGE, ids=[d[2] for d in DAMAGE])
def test_a_damaged_receipt_is_one_line(tmp_path, name, record, damage) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(record))
    with pytest.raises(UserError) as caught:
        read_receipt(path)
    assert str(caught.value) == f"{path}: a damaged receipt ({damage}); delete it to redo that phase"


def test_sound_receipts_read_as_written(tmp_path) -> None:
    for name, record in (("trained.json", TRAINED), ("averaged.json", AVERAGED), ("evaluated.json", {"eval_loss": 2})):
        (tmp_path / name).write_text(json.dumps(record))
        assert read_receipt(tmp_path / name) == record


def test_a_checkpoint_of_another_site_or_one_gone_is_refused(tmp_path) -> None:
    site_a, site_b = tmp_path / "round-001" / "a", tmp_path / "round-001" / "b"
    checkpoint = make_checkpoint(save_model(site_a / "run" / "checkpoints" / "checkpoint-10", 1), 100, 4)
    receipt = site_a / "trained.json"
    record = {**TRAINED, "checkpoint": str(checkpoint)}
    assert checked_checkpoint(receipt, record, "a", 1) == str(checkpoint)
    with pytest.raises(UserError, match=r"^b round 1: .* names .*, not a checkpoint of this site's run in"):
        checked_checkpoint(site_b / "trained.json", {**record, "site": "b"}, "b", 1)
    with pytest.raises(UserError, match="not a checkpoint of this site's run"):
        checked_checkpoint(receipt, record, "a", 2)  # a receipt of another round
    (checkpoint / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UserError, match=r"no longer matches its manifest .*; delete the receipt"):
        checked_checkpoint(receipt, record, "a", 1)
    shutil.rmtree(checkpoint)
    with pytest.raises(UserError, match="no longer matches its manifest"):
        checked_checkpoint(receipt, record, "a", 1)
