"""A federation's receipts, damaged or pointing elsewhere: a missing or mistyped field is one line naming
the file, the damage and the fix; a training receipt whose checkpoint is another site's, or is gone, is
refused before an average builds on it, and so is a round's global model deleted since. A site's kept run config (sites/NAME.yaml) is the one
supertune wrote: a stray one in a new --dir, one with no sha256 on record and one edited by hand are
refused in one line each."""

from __future__ import annotations

import json
import shutil

import pytest

from average_models import make_checkpoint, save_model
from supertune.cli.main import main
from supertune.errors import UserError
from supertune.federation.state.layout import FederationDir
from supertune.federation.state.receipts import checked_checkpoint, checked_global_model, read_receipt, write_receipt
from supertune.federation.state.site_configs import keep_site_configs

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


def test_a_site_config_supertune_did_not_write_or_that_was_edited_is_refused(tmp_path, caplog, capsys) -> None:
    # a stray sites/a.yaml in a new --dir: the directory is not supertune's, nothing is read or changed
    stray = tmp_path / "stray"
    (stray / "sites").mkdir(parents=True)
    (stray / "sites" / "a.yaml").write_text("training: {max_steps: 1}\n")
    (tmp_path / "fed.yaml").write_text("name: f\nrounds: 1\nsites:\n  - name: a\n  - name: b\n")
    assert main(["federate", str(tmp_path / "fed.yaml"), "--dir", str(stray)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"supertune: error: --dir: {stray} holds files supertune did not write (sites); supertune writes only into "
        "a new or empty directory or into its own federation (federation.yaml)"
    ]
    assert [p.name for p in stray.rglob("*")] == ["sites", "a.yaml"]

    root = FederationDir(tmp_path / "fed")
    texts = {"a": "training:\n  max_steps: 8\n", "b": "training:\n  max_steps: 9\n"}
    keep_site_configs(root, texts)  # written, with their sha256 recorded
    keep_site_configs(root, texts)  # and taken again as they are, silently
    assert not caplog.records
    sites = root.path / "sites"
    assert sorted(p.name for p in sites.iterdir()) == ["a.yaml", "b.yaml", "sha256.json"]
    (sites / "a.yaml").write_text("training:\n  max_steps: 80\n")  # edited by hand
    with pytest.raises(UserError) as caught:
        keep_site_configs(root, texts)
    assert str(caught.value) == (
        f"{sites / 'a.yaml'}: edited since supertune wrote it (its sha256 differs from the one in "
        f"{sites / 'sha256.json'}), and the rounds would train with a config no receipt records; delete it, and the "
        "next run writes it again from federation.yaml (put the edit there, as a site's overrides)"
    )
    (sites / "a.yaml").unlink()  # the way out: written again from the federation's config
    keep_site_configs(root, texts)
    assert (sites / "a.yaml").read_text() == texts["a"]
    record = json.loads((sites / "sha256.json").read_text())
    del record["b"]  # a file the record does not name: not written by supertune
    (sites / "sha256.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"b.yaml: supertune did not write it \(no sha256 of it in .*sha256.json\)"):
        keep_site_configs(root, texts)
    # an edit of the federation's own config (the site's overrides) is said to be not applied
    keep_site_configs(root, {"a": "training:\n  max_steps: 7\n"})
    assert "site a: federation.yaml now gives it another run config than" in caplog.text


def test_a_global_model_deleted_since_its_round_is_named_with_the_way_out(tmp_path) -> None:
    from supertune.averaging import average_checkpoints

    inputs = [save_model(tmp_path / name, seed) for name, seed in (("a", 1), ("b", 2))]
    receipt, model = tmp_path / "round-001" / "averaged.json", tmp_path / "round-001" / "global"
    average_checkpoints(inputs, model, weights="uniform")
    write_receipt(receipt, {**AVERAGED, "global_model": str(model)})
    checked_global_model(receipt, 1)  # there, as its manifest lists it
    (model / "model-00001-of-00001.safetensors").write_bytes(b"x")
    with pytest.raises(
        UserError, match=r"^round 1: its global model .* manifest \(model-00001-of-00001.safetensors: 1 bytes"
    ):
        checked_global_model(receipt, 1)
    shutil.rmtree(model)
    with pytest.raises(UserError) as caught:
        checked_global_model(receipt, 1)
    assert str(caught.value).endswith(f"; delete {receipt} to average round 1 again from its sites' checkpoints")
