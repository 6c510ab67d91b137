"""The one module that starts other programs (torchrun today); everything else asks it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["python_module_argv", "run_foreground"]


def run_foreground(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run a command with this terminal's stdin/stdout/stderr and return its exit code.

    Ctrl-C reaches the child's whole process group; this process waits for it to finish its
    cleanup instead of leaving orphans behind.
    """
    merged = dict(os.environ)
    if env:
        merged.update(env)
    proc = subprocess.Popen(list(argv), env=merged)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def python_module_argv(module: str, *args: str) -> list[str]:
    """argv that runs a module of this package with the current interpreter."""
    return [sys.executable, "-m", module, *args]
