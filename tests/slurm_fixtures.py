"""Real Slurm clusters for tests anywhere under tests/: the fixtures `slurm_single` and `slurm_multi`,
`slurm_client` (the environment of a user of `slurm_single`), and `supertune()` to run the CLI.

Registered by tests/conftest.py (pytest_plugins). Each fixture is a session-wide
tests/cluster/slurm_cluster.SlurmCluster, started on first use and stopped when the session ends.
The two use different ports, network names and state directories, so both can be up at once and
tests that use either may run in any order without restarts.

A test that uses one of them is marked `slurm` automatically (`pytest -m slurm` selects them).
Where a cluster cannot run here (not root, Slurm not installed, the daemons do not start), its tests
skip with the reason; with CI set they fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from cluster.slurm_cluster import SlurmCluster, SlurmError

SLURM_FIXTURES = ("slurm_single", "slurm_multi")

TINY_JOB = [
    "training.logging_steps=1",
    "training.report_to=[]",
    "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1",
    "training.per_device_train_batch_size=4",
    "data.max_eval_samples=16",
]
"""The settings every test job on the test cluster shares: one layer, a few eval samples, no sample text."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SLURM_FIXTURES):
            item.add_marker(pytest.mark.slurm)


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"Slurm test cluster unavailable with CI set: {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}")


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        _unavailable("needs root (it starts slurmctld, slurmd and munged); CI runs the suite as root")
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    missing = [t for t in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(t, path=search) is None]
    if missing:
        _unavailable(
            f"{', '.join(missing)} not installed: run `bash tests/cluster/install.sh` as root "
            "(scripts/test.sh does it when run as root)"
        )


def _cluster(mode: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    _check_prerequisites()
    cluster = SlurmCluster()
    try:
        cluster.start(mode, tmp_path_factory.mktemp(f"slurm-{mode}"))
    except (SlurmError, OSError, subprocess.SubprocessError) as exc:
        try:
            cluster.stop()
        except (SlurmError, OSError, subprocess.SubprocessError):
            pass  # the start failure is the message worth showing
        _unavailable(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld + one slurmd on this host (CPUs=2), partition `debug`."""
    yield from _cluster("single", tmp_path_factory)


@pytest.fixture(scope="session")
def slurm_multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two emulated nodes, node1 and node2 (CPUs=2 each), in their own network namespaces."""
    yield from _cluster("multi", tmp_path_factory)


@pytest.fixture(autouse=True)
def slurm_jobs_end_with_their_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that uses a test cluster, passed or failed, every job still on that cluster is
    cancelled and gone before the next test starts: a job that one test leaves behind (its wait timed
    out, an assertion stopped it before its own scancel) would otherwise hold the node's CPUs, and the
    next tests' jobs would wait PENDING until their own timeouts. The clusters live for the session;
    their jobs live for one test (a module fixture that submits jobs waits for them itself)."""
    clusters = [request.getfixturevalue(name) for name in SLURM_FIXTURES if name in request.fixturenames]
    yield
    for cluster in clusters:
        if cluster.running:
            cluster.cancel_all()


@pytest.fixture
def slurm_client(slurm_single: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    """The environment of a user of the single-node cluster, with the shipped local profile (not the tester's own)."""
    env = slurm_single.env
    env["SUPERTUNE_CONFIG_DIR"] = str(tmp_path / "no-user-config")
    return env


def supertune(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The supertune CLI in a child process, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "supertune", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
