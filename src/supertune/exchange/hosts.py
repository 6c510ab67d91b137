"""The few file operations the exchange protocol needs, on the host that holds the exchange: this
machine's filesystem, or a host reached with ssh.

Over ssh each operation is one POSIX shell command on the far side (cat, tail, wc, sha256sum, mv,
mkdir, rm), every path in it quoted; the connection is opened once and shared by the commands
(OpenSSH's ControlMaster, a socket in a private temporary directory), so an operation costs a round
trip, not a handshake. The ssh client is `ssh`, or the command in SUPERTUNE_SSH (e.g. `ssh -F
~/.ssh/exchange_config`), with the user's own ssh configuration, keys and agent; never a password
prompt (BatchMode). A dead connection is noticed within a minute (ServerAliveInterval 15 x 4) and
raised as `Dropped`, which the protocol answers by resuming.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import UserError
from ..file_table import sha256_file
from ..subprocesses import run_captured, run_streamed
from .address import ExchangeAddress

__all__ = ["Dropped", "DirectoryHost", "SshHost", "SSH_ENV", "host_for"]

SSH_ENV = "SUPERTUNE_SSH"


class Dropped(Exception):
    """The connection to the exchange was lost (ssh exit code 255, or fewer bytes arrived than sent)."""


class DirectoryHost:
    """The exchange is a directory this machine reaches through its own filesystem."""

    def size(self, path: str) -> int | None:
        p = Path(path)
        return p.stat().st_size if p.is_file() else None

    def append(self, path: str, chunks: Iterable[bytes]) -> None:
        with open(path, "ab") as f:
            for block in chunks:
                f.write(block)
            f.flush()
            os.fsync(f.fileno())

    def read(self, path: str, offset: int, sink: Callable[[bytes], None]) -> None:
        with open(path, "rb") as f:
            f.seek(offset)
            while block := f.read(1 << 20):
                sink(block)

    def sha256(self, path: str) -> str | None:
        return sha256_file(Path(path)) if Path(path).is_file() else None

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def makedirs(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def remove(self, path: str) -> None:
        p = Path(path)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None


class SshHost:
    """The exchange is a directory on a host reached with ssh, outbound from here."""

    def __init__(self, address: ExchangeAddress) -> None:
        self.address = address
        self._control = tempfile.mkdtemp(prefix="supertune-ssh-")
        client = shlex.split(os.environ.get(SSH_ENV, "ssh")) or ["ssh"]
        self._ssh = [
            *client,
            "-o", "BatchMode=yes",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=4",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control}/%C",
            "-o", "ControlPersist=120",
            *(["-p", str(address.port)] if address.port else []),
            address.destination,
        ]  # fmt: skip

    def _run(self, command: str) -> str:
        got = run_captured([*self._ssh, command], timeout=300)
        self._check(got.returncode, got.stderr, command)
        return got.stdout

    def _check(self, code: int, stderr: str, command: str) -> None:
        said = (stderr.strip().splitlines() or [""])[-1][:300]
        if code == 255 or code == 124:
            raise Dropped(said or f"ssh exit code {code}")
        if code == 127 and "command not found" in said and said.startswith(self._ssh[0]):
            raise UserError(f"exchange {self.address.text}: the ssh client {self._ssh[0]!r} is not installed here")
        if code != 0:
            raise UserError(
                f"exchange {self.address.text}: `{command}` failed on the exchange host (exit {code}): {said}"
            )

    def size(self, path: str) -> int | None:
        q = shlex.quote(path)
        out = self._run(f"if [ -f {q} ]; then wc -c < {q}; fi").strip()
        if not out:
            return None
        if not (out.isascii() and out.isdigit()):
            raise self._unexpected("wc -c", out, "a size in bytes")
        return int(out)

    def append(self, path: str, chunks: Iterable[bytes]) -> None:
        command = f"cat >> {shlex.quote(path)}"
        got = run_streamed([*self._ssh, command], feed=chunks)
        self._check(got.returncode, got.stderr, command)

    def read(self, path: str, offset: int, sink: Callable[[bytes], None]) -> None:
        command = f"tail -c +{offset + 1} {shlex.quote(path)}"
        got = run_streamed([*self._ssh, command], sink=sink)
        self._check(got.returncode, got.stderr, command)

    def sha256(self, path: str) -> str | None:
        q = shlex.quote(path)
        out = self._run(f"if [ -f {q} ]; then sha256sum {q} 2>/dev/null || shasum -a 256 {q}; fi").split()
        if not out:
            return None
        if not re.fullmatch(r"[0-9a-f]{64}", out[0]):
            raise self._unexpected("sha256sum", " ".join(out), "a sha256 and the file's name")
        return out[0]

    def _unexpected(self, command: str, answer: str, expected: str) -> UserError:
        """What ssh brought back is read like any input: an answer other than the command's own (a login
        message that a shell's startup file prints on every command's output) is refused by name."""
        shown = answer if len(answer) <= 80 else answer[:77] + "..."
        return UserError(
            f"exchange {self.address.text}: `{command}` answered {shown!r}, not {expected}: the host prints text of "
            "its own on a command's output (a message from a shell's startup file?); `ssh HOST true` must print nothing"
        )

    def rename(self, source: str, target: str) -> None:
        self._run(f"mv -f {shlex.quote(source)} {shlex.quote(target)}")

    def makedirs(self, path: str) -> None:
        self._run(f"mkdir -p {shlex.quote(path)}")

    def remove(self, path: str) -> None:
        self._run(f"rm -rf {shlex.quote(path)}")

    def ping(self) -> None:
        self._run("true")

    def close(self) -> None:
        run_captured([*self._ssh[:-1], "-O", "exit", self._ssh[-1]], timeout=30)
        shutil.rmtree(self._control, ignore_errors=True)


def host_for(address: ExchangeAddress) -> DirectoryHost | SshHost:
    return SshHost(address) if address.host else DirectoryHost()
