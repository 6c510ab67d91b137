"""The one module that starts other programs (torchrun, Slurm's commands, StreamFlow); everything else asks it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Captured",
    "run_captured",
    "run_streamed",
    "run_foreground",
    "run_logged",
    "run_logged_until",
    "run_group_logged",
    "end_group",
]


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
        proc = subprocess.Popen(
            list(argv),
            env=merged,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


@contextlib.contextmanager
def _group_logged(argv: Sequence[str], logfile: Path, env: Mapping[str, str] | None) -> Iterator[subprocess.Popen]:
    """A program started in a session (process group) of its own, dying with this process, its output
    appended to `logfile`; the log is closed when the block ends."""
    merged = dict(os.environ)
    if env:
        merged.update(env)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        yield subprocess.Popen(
            list(argv), env=merged, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip


def run_logged_until(
    argv: Sequence[str], logfile: Path, until: float, env: Mapping[str, str] | None = None, grace: float = 30.0
) -> int | None:
    """`run_logged` with a deadline (`until`, unix time): the command runs in a process group of its own
    and, if it is still running when the deadline passes, the whole group (torchrun and its workers)
    gets SIGTERM and, `grace` seconds later, SIGKILL; then None instead of an exit code. A training
    worker answers SIGTERM by stopping at its next step, so the grace is usually a step's time."""
    with _group_logged(argv, logfile, env) as proc:
        try:
            while True:
                try:
                    return proc.wait(timeout=max(0.0, min(until - time.time(), 5.0)))
                except subprocess.TimeoutExpired:
                    if time.time() >= until:
                        _end_group(proc.pid, grace)
                        proc.wait()
                        return None
        except KeyboardInterrupt:
            _signal_group(proc.pid, signal.SIGINT)  # its own session: Ctrl-C does not reach it by itself
            return proc.wait()


def run_group_logged(
    argv: Sequence[str],
    logfile: Path,
    group_file: Path,
    env: Mapping[str, str] | None = None,
    grace: float = 30.0,
    until: float | None = None,
) -> int | None:
    """Run a program in a process group of its own, output appended to `logfile`; its exit code.

    For programs that start programs of their own and do not always end them (StreamFlow leaves its
    local steps running when it fails or is interrupted): when the program has exited, or Ctrl-C
    reached this process, whatever is left of its group gets SIGTERM and, `grace` seconds later,
    SIGKILL. The group's id is kept in `group_file` while it runs, so that after a SIGKILL of this
    process (the program then dies with it, its children not) `end_group` can end the rest. With
    `until` (unix time), the group is ended the same way when it passes, and None is returned.
    """
    with _group_logged(argv, logfile, env) as proc:
        group_file.write_text(f"{proc.pid}\n", encoding="utf-8")
        try:
            try:
                while True:
                    wait = None if until is None else max(0.0, min(until - time.time(), 5.0))
                    try:
                        return proc.wait(timeout=wait)
                    except subprocess.TimeoutExpired:
                        if until is not None and time.time() >= until:
                            _end_group(proc.pid, grace)
                            proc.wait()
                            return None
            except KeyboardInterrupt:
                _signal_group(proc.pid, signal.SIGINT)
                try:
                    return proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    return proc.wait()
        finally:
            _end_group(proc.pid, grace)
            group_file.unlink(missing_ok=True)


def end_group(group_file: Path, marker: str, grace: float = 30.0) -> bool:
    """End what is left of a group that `run_group_logged` started and could not end (this process
    was killed): only when one of its processes still runs with `marker` in its command line (a
    process group id is reused once all of its processes are gone). True when there was one."""
    try:
        pgid = int(group_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return False
    found = any(marker in command for command in _group_commands(pgid) or [])
    if found:
        _end_group(pgid, grace)
    group_file.unlink(missing_ok=True)
    return found


def _group_commands(pgid: int) -> list[str] | None:
    """Command lines of the live processes (zombies left out) in group `pgid`; None without /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    commands = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # The command name in parentheses may hold spaces: the fields after the last ')' are fixed.
            fields = stat.read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                commands.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return commands


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # the id now belongs to someone else's group
    return True


def _end_group(pgid: int, grace: float) -> None:
    """SIGTERM to every process left in the group, SIGKILL to those still there after `grace` seconds.
    Zombies do not count: where nothing reaps orphans (a container without an init), they stay."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        live = _group_commands(pgid)
        if (live is not None and not live) or (live is None and not _signal_group(pgid, 0)):
            return
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)


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


def run_captured(
    argv: Sequence[str], timeout: float = 60.0, env: Mapping[str, str] | None = None, input: str | None = None
) -> Captured:
    """Run a command to completion and capture its output; a missing program is exit code 127.
    `input` goes to its stdin; without it stdin is empty (a prompt cannot wait for an answer).

    Output is read as UTF-8 whatever it holds: a byte that is not UTF-8 (a damaged controller, a
    login banner in another encoding) becomes U+FFFD, so the caller checks every value it uses as it
    checks any input, instead of failing in the decoding."""
    merged = dict(os.environ)
    if env:
        merged.update(env)
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, encoding="utf-8", errors="replace", timeout=timeout, env=merged, **stdin
        )
    except FileNotFoundError:
        return Captured(127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Captured(124, "", f"{argv[0]}: no answer within {timeout:.0f} s")
    return Captured(proc.returncode, proc.stdout, proc.stderr)


def run_streamed(
    argv: Sequence[str],
    *,
    feed: Iterable[bytes] | None = None,
    sink: Callable[[bytes], None] | None = None,
    env: Mapping[str, str] | None = None,
    chunk: int = 1 << 20,
) -> Captured:
    """Run a command with `feed`'s chunks written to its stdin, or its stdout handed to `sink` a chunk
    at a time (bytes that never sit whole in memory: a model going over ssh); stderr is captured. A
    command that stops reading ends the feed (its exit code says why); a missing program is 127."""
    import threading

    merged = dict(os.environ)
    if env:
        merged.update(env)
    try:
        proc = subprocess.Popen(
            list(argv),
            env=merged,
            stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if sink is not None else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError:
        return Captured(127, "", f"{argv[0]}: command not found")
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    drain.start()
    try:
        if feed is not None:
            try:
                for block in feed:
                    proc.stdin.write(block)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        if sink is not None:
            while block := proc.stdout.read(chunk):
                sink(block)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    drain.join()
    return Captured(code, "", b"".join(errors).decode("utf-8", "replace"))
