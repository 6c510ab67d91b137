"""Stop signals and the files that carry a stop request between processes (no heavy imports:
installed first thing in every training process, whose imports take seconds, while SIGUSR1's
default action would end the process)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "STOP_FILE",
    "STOPPED_FILE",
    "REQUEUE_EXIT_CODE",
    "STOP_SIGNALS",
    "install_signal_handlers",
    "received_signal",
    "clear_stop_files",
    "request_stop",
]

STOP_FILE = "stop-request"
"""Created (by the job script, or by `supertune train` for its workers) to ask a run to checkpoint and stop."""
STOPPED_FILE = "stopped.json"
"""Written by the main process when a run stopped on request after saving its checkpoint."""
REQUEUE_EXIT_CODE = 75
"""Exit code of `supertune train` after such a stop (EX_TEMPFAIL): run it again to resume."""

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_received: str | None = None


def install_signal_handlers(also: Callable[[str], None] | None = None) -> None:
    """Catch SIGUSR1 and SIGTERM from now on: remember the first, say so once, and call `also`."""

    def on_signal(signum: int, frame: Any) -> None:
        global _received
        name = signal.Signals(signum).name
        if _received is None:
            _received = name
            print(f"supertune: {name} received: finishing the current step, then saving a checkpoint and stopping", file=sys.stderr, flush=True)
        if also is not None:
            also(name)

    import threading

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (supertune used as a library from a thread)
    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)


def received_signal() -> str | None:
    """The name of the first stop signal this process received, if any."""
    return _received


def request_stop(run_dir: Path) -> None:
    """Ask the training processes of a run to checkpoint and stop (they look once per step)."""
    (run_dir / STOP_FILE).touch()


def clear_stop_files(run_dir: Path) -> None:
    """Before a (re)start: no stop request nor stop record left from the previous attempt."""
    for name in (STOP_FILE, STOPPED_FILE):
        (run_dir / name).unlink(missing_ok=True)
