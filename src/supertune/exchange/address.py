"""Where a federation's exchange is: a directory (on this machine, or on a filesystem every party
mounts), or `ssh://[user@]host[:port]/absolute/path` on a host every party reaches with its own ssh
client, outbound (the one direction a supercomputer's login node allows).

Host, user and path are checked here, once: the path goes into the commands run on the exchange host
only quoted, and neither host nor user may start with '-' (an ssh option).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import UserError

__all__ = ["ExchangeAddress", "parse_exchange"]

_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$|^\[[0-9A-Fa-f:.]+\]$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ExchangeAddress:
    text: str
    """As the user wrote it."""
    path: str
    """The exchange directory: absolute, on the exchange host (or here)."""
    host: str | None = None
    """None: a directory reached through this machine's filesystem."""
    user: str | None = None
    port: int | None = None

    @property
    def destination(self) -> str:
        """[user@]host, as ssh takes it."""
        assert self.host is not None
        host = self.host.strip("[]")
        return f"{self.user}@{host}" if self.user else host


def parse_exchange(text: str, option: str = "exchange") -> ExchangeAddress:
    """The address `text` names; UserError naming `option` and the form it takes when it is none."""
    if not text or "\n" in text or "\0" in text:
        raise UserError(f"{option}: give a directory or ssh://[user@]host[:port]/absolute/path, got {text!r}")
    if "://" not in text:
        return ExchangeAddress(text, str(Path(text).expanduser().absolute()))
    form = "ssh://[user@]host[:port]/absolute/path, e.g. ssh://me@exchange.example.org/srv/federation"
    parts = urlsplit(text)
    if parts.scheme != "ssh":
        raise UserError(f"{option}: {text!r}: only ssh:// addresses (or a directory) are supported; give {form}")
    try:
        port = parts.port
    except ValueError:
        raise UserError(f"{option}: {text!r}: the port is not a number from 1 to 65535; give {form}") from None
    host, user, path = parts.hostname, parts.username, unquote(parts.path)
    problems = []
    if not host or not _HOST.match(host if ":" not in host else f"[{host}]"):
        problems.append("no usable host")
    if user is not None and not _USER.match(user):
        problems.append(f"user {user!r} is not a plain login name")
    if parts.password is not None:
        problems.append("a password in the address (use a key: ssh-agent or ~/.ssh/config)")
    if not path.startswith("/") or path.rstrip("/") == "":
        problems.append("no absolute path after the host (the exchange directory)")
    if parts.query or parts.fragment:
        problems.append("a query or fragment")
    if port is not None and not 1 <= port <= 65535:
        problems.append("a port outside 1 to 65535")
    if problems:
        raise UserError(f"{option}: {text!r}: {'; '.join(problems)}; give {form}")
    host_text = f"[{host}]" if ":" in (host or "") else host
    return ExchangeAddress(text, path.rstrip("/") or "/", host=host_text, user=user, port=port)
