"""Test-wide setup: offline, isolated caches shared by the test process and every process it starts."""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

# the slurm_single / slurm_multi fixtures (tests/slurm_fixtures.py); the ddp run the strategy tests compare with;
# a real sshd on loopback for the exchange tests (tests/ssh_server.py)
pytest_plugins = ["slurm_fixtures", "strategy_runs", "ssh_server"]

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


# Test files that start a Slurm test cluster (a session fixture of tests/slurm_fixtures.py), found
# by the names that reach one: read from the files, since pytest-xdist's scheduler runs in a process
# that collects no tests.
_SLURM_FILE = re.compile(r"\b(slurm_single|slurm_multi|slurm_client|mark\.slurm)\b")
# Test files that compare with the DDP run of tests/strategy_runs.py (a test taking the `ddp` fixture):
# a session fixture, so each worker that runs one of them trains its own copy (~27 CPU-s).
_DDP_FILE = re.compile(r"def test_\w+\(\s*ddp\b")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (`-n 2`, as scripts/test.sh runs the suite), which worker runs what.

    Every file that uses a Slurm test cluster goes to one worker: a cluster is a session fixture,
    and two workers would each start one on the same ports and network namespaces. So does every
    file that compares with the session's DDP run (the ZeRO and FSDP tests), which is then trained
    once. Every other file stays whole on one worker, so that a module's fixture (a federation run,
    a reference training) is computed once. (xdist's own `--dist loadgroup` marks groups in a node
    id attribute that pytest 9 no longer reads, so the grouping is done here, by file.)
    """
    from xdist.scheduler import LoadScopeScheduling

    root = Path(config.rootpath)
    texts = {
        path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
        for path in (root / "tests").rglob("test_*.py")
    }
    slurm = {path for path, text in texts.items() if _SLURM_FILE.search(text)}
    ddp = {path for path, text in texts.items() if _DDP_FILE.search(text)} - slurm

    class FileOrSlurm(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "slurm" if path in slurm else "ddp" if path in ddp else path

    return FileOrSlurm(config, log)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def library_log_handlers_outlive_captures():
    """transformers, huggingface_hub and datasets each give their library's root logger a
    StreamHandler bound to sys.stderr as it is at their first import (transformers also binds the
    handler's flush to it), as does transformers' ContinuousBatchingLogger. A test that calls a command
    in-process under capsys and imports one of them first binds it to that test's capture, which pytest
    closes when the test ends: every later record of the library, in any later test, then prints
    "--- Logging error ---" with a traceback (test_bad_input.py's warning on grown embeddings, after
    test_config_errors.py's in-process `config show`). After each test such a handler is pointed at
    the session's stderr again, as if the library had been imported at collection. Costs a walk over
    the loggers per test: 0.1 ms for the 269 of torch, transformers and datasets."""
    yield
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", ()):
            stream = handler.__dict__.get("stream")
            if isinstance(handler, logging.StreamHandler) and getattr(stream, "closed", False):
                handler.__dict__.pop("flush", None)  # transformers' bound flush of the closed stream
                handler.stream = sys.stderr
