"""Fixtures of the recipe replays (tests/recipes/replay.py has the helpers): CPU-scaled data files
made once per session, in the shapes the recipes read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay import documents


@pytest.fixture(scope="session")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """run_clm-style local files: train.txt and validation.txt, one document per line."""
    from supertune.embedded import default_tokenizer

    default_tokenizer()  # built once here, before jobs on several nodes would all build it at once
    root = tmp_path_factory.mktemp("text-files")
    train, validation = root / "train.txt", root / "validation.txt"
    train.write_text("\n".join(documents(600)) + "\n", encoding="utf-8")
    validation.write_text("\n".join(documents(40, "validation")) + "\n", encoding="utf-8")
    return train, validation


@pytest.fixture(scope="session")
def jsonl_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """JSON-lines training and validation files with a "text" field."""
    root = tmp_path_factory.mktemp("jsonl-files")
    train, validation = root / "train.jsonl", root / "validation.jsonl"
    train.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(600)), encoding="utf-8")
    validation.write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in documents(40, "validation")), encoding="utf-8"
    )
    return train, validation
