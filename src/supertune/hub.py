"""Resolve a model or tokenizer reference without ever hanging on an unreachable hub.

Compute nodes at most HPC centres have no internet. A hub id is served from the local Hugging Face
cache when it is there; otherwise supertune checks in a few seconds whether the hub can be reached
and, if not, stops with the two ways out (HF_HUB_OFFLINE with a pre-download, or a local path)
instead of letting an HTTP client retry for minutes.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from .errors import UserError

__all__ = ["Resolved", "reachable", "resolve_reference"]

_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Resolved:
    """What to pass to from_pretrained: the reference and whether to stay off the network."""

    ref: str
    local_files_only: bool


def resolve_reference(ref: str, field: str, probe_file: str, revision: str | None = None) -> Resolved:
    """Resolve a local directory or a hub id for `field` (e.g. "model.name_or_path")."""
    path = os.path.expanduser(ref)
    if os.path.isdir(path):
        return Resolved(os.path.abspath(path), True)
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(ref, probe_file, revision=revision)
    if isinstance(cached, str):
        return Resolved(ref, True)
    if constants.HF_HUB_OFFLINE:
        raise UserError(
            f"{field}: {ref!r} is not a local directory and not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
            f"download it on a machine with internet (hf download {ref}) into HF_HOME, or give a local directory"
        )
    endpoint = constants.ENDPOINT
    if not reachable(endpoint):
        raise UserError(
            f"{field}: {ref!r} is not a local directory or in the Hugging Face cache, and the hub ({endpoint}) cannot be "
            f"reached from this machine; pre-download it and set HF_HUB_OFFLINE=1, or give a local directory"
        )
    return Resolved(ref, False)


def reachable(endpoint: str) -> bool:
    """Whether a TCP connection to the endpoint opens within a few seconds."""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
