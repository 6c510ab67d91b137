"""The one module that starts other programs (torchrun today); everything else asks it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Captured", "python_module_argv", "run_captured", "run_foreground"]


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


@dataclass(frozen=True)
class Captured:
    """Exit code and output of a finished command."""

    returncode: int
    stdout: str
    stderr: str


def run_captured(argv: Sequence[str], timeout: float = 60.0, env: Mapping[str, str] | None = None) -> Captured:
    """Run a command to completion and capture its output; a missing program is exit code 127."""
    merged = dict(os.environ)
    if env:
        merged.update(env)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=merged, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return Captured(127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Captured(124, "", f"{argv[0]}: no answer within {timeout:.0f} s")
    return Captured(proc.returncode, proc.stdout, proc.stderr)


def python_module_argv(module: str, *args: str) -> list[str]:
    """argv that runs a module of this package with the current interpreter."""
    return [sys.executable, "-m", module, *args]
