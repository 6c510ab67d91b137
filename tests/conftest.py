"""Test-wide setup: offline, isolated caches shared by the test process and every process it starts."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

# the slurm_single / slurm_multi fixtures (tests/slurm_fixtures.py); the ddp run the strategy tests compare with
pytest_plugins = ["slurm_fixtures", "strategy_runs"]

_ROOT = Path(tempfile.mkdtemp(prefix="supertune-tests-"))
os.environ["SUPERTUNE_CACHE"] = str(_ROOT / "cache")
os.environ["HF_HOME"] = str(_ROOT / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture()
def fresh_log_handlers():
    """An in-process `train` (logging.basicConfig) leaves a root handler on the stderr pytest captured
    for that test and has closed since; a later record sent there prints "--- Logging error ---"."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    yield
    root.handlers = saved
