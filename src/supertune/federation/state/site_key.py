"""A site's X25519 key pair for secure aggregation (docs/federated/privacy.md, "Secure aggregation").

`supertune federate --site NAME EXCHANGE --new-key KEYFILE` makes it at the site: the private key, 32
raw bytes, in KEYFILE (mode 0600 from its creation; an existing file is never overwritten), and the
public key printed, which the federation config pins as `sites[].public_key`. The private key never
leaves the site. The agent runs with `--key KEYFILE`: a key file another user owns or others can read
is refused (private_files.py, the noise key's rule), and so is a key whose public key is not the one
pinned for the site, in one line naming the site.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError
from ...transfer.secure_masks import new_private_key, public_key_text
from ..config.schema import FederationConfig, SiteConfig
from .private_files import read_private_file, write_private_file

__all__ = ["make_site_key", "read_site_key", "agent_key"]

_KEY_BYTES = 32


def make_site_key(path: Path) -> str:
    """Write a new private key to `path` (refused if it exists) and return its public key's text."""
    private = new_private_key()
    write_private_file(path, private, "--new-key: the key file")
    return public_key_text(private)


def read_site_key(path: Path) -> bytes:
    """The site's private key from `path`, refused in one line if it is missing, damaged or not private."""
    if not path.is_file():
        raise UserError(
            f"--key: {path} is not a file; make the site's key with supertune federate --site NAME EXCHANGE --new-key {path}"
        )
    return read_private_file(
        path,
        "--key: the site's private key",
        "run the agent as its owner, or make a key of your own (--new-key)",
        _KEY_BYTES,
        "it is damaged, or another kind of key than --new-key makes",
    )


def agent_key(fed: FederationConfig, site: SiteConfig, path: str | None) -> bytes | None:
    """The private key an agent runs with (`--key`), checked against the key the federation pins for its
    site; None without --key (refused when the federation masks the sites' changes)."""
    if path is None:
        if fed.privacy.secure_aggregation:
            raise UserError(
                f"--key: federation {fed.name} masks the sites' changes (privacy.secure_aggregation); run the agent "
                f"with --key KEYFILE, the key whose public key is pinned for site {site.name}"
            )
        return None
    private = read_site_key(Path(path).expanduser())
    own = public_key_text(private)
    if site.public_key is None:
        raise UserError(
            f"sites ({site.name}).public_key: federation {fed.name} pins no key for this site; pin {own} "
            "(the public key of --key) in the federation config"
        )
    if site.public_key.strip() != own:
        raise UserError(
            f"sites ({site.name}).public_key: the federation pins {site.public_key.strip()}, not {own}, the public "
            f"key of --key {path}; run the agent with the key that made the pinned one, or pin this one"
        )
    return private
