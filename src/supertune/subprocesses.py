"""The one module that starts other programs (torchrun today); everything else asks it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Captured", "run_captured", "run_foreground", "run_logged"]


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


def run_logged(argv: Sequence[str], logfile: Path, env: Mapping[str, str] | None = None) -> int:
    """Run a command with its output appended to `logfile` (created with its folder); its exit code.

    The child dies with this process (Linux PR_SET_PDEATHSIG): a federation killed while a site
    trains leaves no training behind to race the resumed one for the same run directory.
    """
    merged = dict(os.environ)
    if env:
        merged.update(env)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        proc = subprocess.Popen(list(argv), env=merged, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux only; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


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
