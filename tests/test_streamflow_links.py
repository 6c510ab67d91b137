"""The StreamFlow steps' model links (executors/streamflow/site_task.py `link_tree`): a site's
start-model is made from the round's global model only when there is one, so that a missing model
is a failed attempt (retried, then the site left out) and not an empty folder every later attempt
keeps and fails on (docs/federated/streamflow.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supertune.federation.executors.streamflow.site_task import link_tree
from supertune.federation.rounds.failures import FederationError


def test_a_missing_or_empty_model_is_a_failed_attempt_and_leaves_no_folder(tmp_path: Path) -> None:
    start = tmp_path / "site" / "start-model"
    for source in (tmp_path / "nowhere", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(FederationError) as caught:
            link_tree(source, start)
        assert caught.value.reason == f"failed: no model at {source.name}"
        assert str(caught.value).startswith(f"{source} is missing or holds no files, so {start} cannot be made")
        assert not start.exists()


def test_the_next_attempt_links_the_model_and_an_empty_leftover_is_replaced(tmp_path: Path) -> None:
    model, start = tmp_path / "global", tmp_path / "site" / "start-model"
    start.mkdir(parents=True)  # what an earlier version left for a missing model
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    link_tree(model, start)
    assert sorted(p.name for p in start.iterdir()) == ["config.json", "model.safetensors"]
    assert (start / "model.safetensors").read_bytes() == b"weights"
    (model / "model.safetensors").unlink()  # a complete folder is kept as it is
    link_tree(model, start)
    assert (start / "model.safetensors").read_bytes() == b"weights"
