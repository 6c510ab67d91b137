"""Stop signals, and the run-dir files that carry a stop request between processes (no heavy
imports: installed first thing in every training process, whose imports take seconds, while
SIGUSR1's default action would end the process)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

from ...rundir import RunDir

__all__ = [
    "STOP_SIGNALS",
    "install_signal_handlers",
    "received_signal",
    "clear_stop_files",
    "request_stop",
]

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_received: str | None = None


def install_signal_handlers(also: Callable[[str], None] | None = None) -> None:
    """Catch SIGUSR1 and SIGTERM from now on: remember the first, say so once, and call `also`."""

    def on_signal(signum: int, frame: Any) -> None:
        global _received
        name = signal.Signals(signum).name
        if _received is None:
            _received = name
            print(
                f"supertune: {name} received: finishing the current step, then saving a checkpoint and stopping",
                file=sys.stderr,
                flush=True,
            )
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


def request_stop(run: RunDir) -> None:
    """Ask the training processes of a run to checkpoint and stop (they look once per step)."""
    run.stop_request.touch()


def clear_stop_files(run: RunDir) -> None:
    """Before a (re)start: no stop request nor stop record left from the previous attempt."""
    run.stop_request.unlink(missing_ok=True)
    run.stopped.unlink(missing_ok=True)
