"""The secret a site draws its privacy noise with: 32 random bytes made at the site the first time it
sends a noised change (`privacy/<site>.key` in the directory of whoever makes its packages: the
federation's with the built-in executor, the agent's own with site agents), readable by its owner only,
and never sent.

Noise drawn from numbers everyone knows (the federation's seed, the round, the site) could be drawn
again by the coordinator and subtracted. Drawn from this key, it cannot; and because the key is kept,
a package made again after a kill holds the same noise, byte for byte, as the first one would have.
Deleting the key gives later packages other noise (their privacy holds; the federation no longer
resumes to the global model it would have reached).
"""

from __future__ import annotations

import hashlib
import os
import secrets

from .layout import FederationDir
from .private_files import read_private_file

__all__ = ["site_noise_key", "KEY_BYTES"]

KEY_BYTES = 32


def site_noise_key(root: FederationDir, site: str, *parts: object) -> bytes:
    """The key of the site's noise for one package: sha256 of the site's secret and `parts` (the round,
    the site, the digests of what the change is taken between), so that another change gets other noise."""
    secret = _site_secret(root, site)
    h = hashlib.sha256(secret)
    for part in (site, *parts):
        h.update(b"\0" + str(part).encode())
    return h.digest()


def _site_secret(root: FederationDir, site: str) -> bytes:
    path = root.noise_key(site)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never over a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    # whoever owns it can read it, and may have written it: a key this process did not make is no secret
    return read_private_file(
        path,
        "privacy: the site's noise key",
        "make the packages as its owner, or delete it for a new key (later packages get other noise)",
        KEY_BYTES,
        "it is damaged. Deleting it makes a new one (later packages get other noise)",
    )
