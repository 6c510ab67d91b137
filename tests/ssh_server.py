"""A real OpenSSH server for the tests of a federation's exchange: Debian's sshd, started on a free
loopback port with a host key and a client key made for the test, logging in as the user running the
tests (as root in CI; as anyone else sshd serves only that user, which is all the tests need)."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class SshServer:
    url: str
    """ssh://user@127.0.0.1:PORT (append an absolute path)."""
    ssh: str
    """The ssh client command that trusts this server's key and logs in with the test's key (SUPERTUNE_SSH)."""
    root: Path

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SUPERTUNE_SSH=self.ssh)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory: pytest.TempPathFactory):
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).is_file() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(
                "CI is set and OpenSSH's server or client is not installed (scripts/test.sh installs them as root)"
            )
        pytest.skip("OpenSSH's server (sshd) is not installed: apt-get install openssh-server")
    root = tmp_path_factory.mktemp("sshd")
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)], check=True)
    port = _free_port()
    (root / "sshd_config").write_text(
        "\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host'}", f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {root / 'client.pub'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password", "MaxStartups 100",
        ]) + "\n"
    )  # fmt: skip
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation directory
    log = (root / "sshd.log").open("w")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"sshd did not start: {(root / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.1)
    host_key = " ".join((root / "host.pub").read_text().split()[:2])
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    ssh = (
        f"ssh -F /dev/null -o UserKnownHostsFile={root / 'known_hosts'} -o StrictHostKeyChecking=yes "
        f"-o IdentitiesOnly=yes -i {root / 'client'}"
    )
    try:
        yield SshServer(f"ssh://{getpass.getuser()}@127.0.0.1:{port}", ssh, root)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
