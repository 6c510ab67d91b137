"""A site reached over SSH (executor: streamflow): its login node as `[user@]host[:port]`, the ssh
words that reach it, the paths a shell reads unquoted, and the checks of a site's login keys."""

from __future__ import annotations

import re
from typing import Protocol

__all__ = ["SiteLogin", "login_parts", "login_ssh_words", "plain_path", "streamflow_site_problems"]


class SiteLogin(Protocol):
    """The keys of a site (schema.SiteConfig) that say where it is reached; a protocol, so that the
    executors' records (config/executors.py), which the schema's choices come from, need no schema."""

    where: str
    login: str | None
    workdir: str | None
    python: str | None


# StreamFlow writes working directories and environment values into shell commands unquoted
# (`cd DIR && export K="V" && ...`): paths it sees keep to characters that mean nothing to a shell.
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+,:@%=-]*\Z")
_LOGIN = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)(?::(?P<port>[0-9]{1,5}))?$"
)


def streamflow_site_problems(where: str, site: SiteLogin) -> list[str]:
    """A site reached over SSH names its login node, a directory and a Python there; a site without
    login runs on this machine (or submits to a SLURM reachable from it) under the federation directory."""
    p: list[str] = []
    if not site.login:
        for key in ("workdir", "python"):
            if getattr(site, key):
                p.append(
                    f"{where}.{key}: only used for a site reached over SSH; set {where}.login, or remove {key} (this machine's are used)"
                )
        return p
    if login_parts(site.login) is None:
        p.append(
            f"{where}.login: {site.login!r} is not [user@]host[:port], e.g. me@login.leonardo.cineca.it or login01:2222"
        )
    if site.where == "local":
        p.append(
            f"{where}.where: a site reached over SSH trains through its SLURM; name its cluster profile (e.g. where: leonardo)"
        )
    if not site.workdir:
        p.append(
            f"{where}.workdir: a site reached over SSH needs a directory there for its runs and models, e.g. /leonardo_scratch/me/federation"
        )
    elif not plain_path(site.workdir):
        p.append(
            f"{where}.workdir: {site.workdir!r} must be an absolute path of letters, digits and _./+,:@%=- (StreamFlow passes it to a shell unquoted)"
        )
    if not site.python:
        p.append(
            f"{where}.python: a site reached over SSH needs the path of its Python with supertune installed, e.g. /project/me/supertune/.venv/bin/python"
        )
    elif not plain_path(site.python):
        p.append(f"{where}.python: {site.python!r} must be an absolute path of letters, digits and _./+,:@%=-")
    return p


def login_parts(login: str) -> tuple[str | None, str, int | None] | None:
    """(user, host, port) of `[user@]host[:port]`; None when it is not that."""
    m = _LOGIN.match(login)
    if m is None:
        return None
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        return None
    return m["user"], m["host"], port


def login_ssh_words(login: str, key: str | None, connect_timeout: int | None = None) -> list[str]:
    """ssh to a site's login node (`[user@]host[:port]`), for its commands there: scancel, squeue, a check."""
    user, host, port = login_parts(login) or (None, login, None)
    words = ["ssh", "-o", "BatchMode=yes"]
    if connect_timeout:
        words += ["-o", f"ConnectTimeout={connect_timeout}"]
    if port:
        words += ["-p", str(port)]
    if key:
        words += ["-i", key]
    return [*words, f"{user}@{host}" if user else host]


def plain_path(path: str) -> bool:
    """An absolute path that a shell reads as it is (no quoting needed)."""
    return bool(_PLAIN_PATH.match(path))
