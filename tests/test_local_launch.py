"""`supertune train --nproc N` on this machine: the torchrun command and the CPU-thread warning."""

from __future__ import annotations

import sys

from supertune.launch.local import thread_oversubscription, torchrun_argv


def test_torchrun_runs_the_worker_on_the_run_directory():
    argv = torchrun_argv(2, ["/runs/r"], max_restarts=3)
    assert argv[:3] == [sys.executable, "-m", "supertune.launch.torchrun_agent"]  # torch's run, one-line failures
    assert "--nproc-per-node=2" in argv and "--max-restarts=3" in argv and argv[-1] == "/runs/r"


def test_more_threads_than_cores_is_named_with_the_value_that_fits():
    warning = thread_oversubscription(2, "2", 2)
    assert warning is not None
    assert warning.startswith("OMP_NUM_THREADS=2 x 2 processes = 4 CPU threads on 2 usable cores")
    assert "set OMP_NUM_THREADS=1" in warning
    assert "set OMP_NUM_THREADS=4" in (thread_oversubscription(4, "8", 16) or "")


def test_threads_that_fit_or_unset_say_nothing():
    assert thread_oversubscription(2, None, 2) is None  # torchrun gives each process 1
    assert thread_oversubscription(2, "1", 2) is None
    assert thread_oversubscription(4, "4", 16) is None
    assert thread_oversubscription(2, "lots", 2) is None  # not a number: left to the OpenMP runtime
