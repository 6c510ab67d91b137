"""Test-wide setup: offline, isolated caches shared by the test process and every process it starts."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

from slurm_fixtures import SLURM_FIXTURES

# the slurm_single / slurm_multi fixtures (tests/slurm_fixtures.py); the ddp run the strategy tests compare with
pytest_plugins = ["slurm_fixtures", "strategy_runs"]

_ROOT = Path(tempfile.mkdtemp(prefix="supertune-tests-"))
os.environ["SUPERTUNE_CACHE"] = str(_ROOT / "cache")
os.environ["HF_HOME"] = str(_ROOT / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# One CPU thread per process unless the tester chose. The suite runs two pytest workers on two cores
# (scripts/test.sh), and most tests start training processes of their own: with torch's default of a
# thread per core in each, they spin against each other (30 steps of the default run took 47 to 120 s
# instead of 19 to 29 s with one thread, while other processes were busy). A second thread buys
# little for the tests' tiny models.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups in the same hook
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n 2 --dist loadgroup`, as scripts/test.sh runs the suite), which worker runs what.

    Every test of the Slurm test clusters goes to one worker: a cluster is a session fixture, and two
    workers would each start one on the same ports. Every other test stays with the rest of its file,
    so that a module's fixture (a federation run, a reference training) is computed once.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        slurm = item.get_closest_marker("slurm") or set(SLURM_FIXTURES) & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("slurm" if slurm else item.nodeid.split("::", 1)[0]))


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
