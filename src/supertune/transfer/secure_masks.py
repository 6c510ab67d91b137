"""Pairwise masks that cancel in the sites' sum: X25519 key agreement, HKDF-SHA256, ChaCha20, all from
the `cryptography` package (no primitive is written here).

Each site holds an X25519 private key; the federation config pins every site's public key. Two sites
i and j agree a shared secret, and HKDF-SHA256 derives from it one key for the pair per federation
id, round and attempt (a new attempt after a dropout never reuses a mask). ChaCha20 under that key
expands the mask: word k of a stream (a tensor's values, its scales) is the k-th 32-bit word of the
keystream under a nonce drawn from the stream's name, so a slice of a tensor masks on its own. Site i
adds the pair's mask for every peer after it in name order and subtracts it for every peer before
it: the masks cancel in the sum mod 2^bits, and any one upload with at least one honest peer is
uniformly distributed.

`cryptography` (the `privacy` extra) is imported by the functions that use it, so that reading a pinned
public key, which a federation config's check does, needs no more than the core.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

import numpy as np

__all__ = ["MaskContext", "PairMasks", "new_private_key", "public_key_text", "read_public_key"]

_WORDS_PER_BLOCK = 16  # a ChaCha20 block is 64 bytes: 16 words of 32 bits
_INFO = b"supertune secure sum v1"


def new_private_key() -> bytes:
    """A fresh X25519 private key, 32 raw bytes."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return X25519PrivateKey.generate().private_bytes_raw()


def public_key_text(private_key: bytes) -> str:
    """The public key of a raw private key, as the federation config pins it: base64 of 32 bytes."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    public = X25519PrivateKey.from_private_bytes(private_key).public_key().public_bytes_raw()
    return base64.b64encode(public).decode("ascii")


def read_public_key(text: str) -> bytes:
    """The 32 raw bytes of a pinned public key; ValueError naming what is wrong."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 (a public key is the 44 characters `federate --new-key` printed)") from None
    if len(raw) != 32:
        raise ValueError(f"is {len(raw)} bytes, not the 32 of an X25519 public key")
    return raw


@dataclass(frozen=True)
class MaskContext:
    """What one set of masks is for: a federation, a round and an attempt at its secure sum."""

    federation: str
    round: int
    attempt: int

    def info(self, pair: tuple[str, str]) -> bytes:
        return _INFO + json.dumps([self.federation, self.round, self.attempt, sorted(pair)]).encode()


class PairMasks:
    """One site's masks against its peers in one context."""

    def __init__(self, site: str, private_key: bytes, peers: dict[str, bytes], context: MaskContext) -> None:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        own = X25519PrivateKey.from_private_bytes(private_key)
        self.site = site
        self.keys: dict[str, bytes] = {}
        for peer, public in sorted(peers.items()):
            if peer == site:
                continue
            shared = own.exchange(X25519PublicKey.from_public_bytes(public))
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=context.info((site, peer)))
            self.keys[peer] = hkdf.derive(shared)

    def apply(self, values: np.ndarray, stream: str, start: int, bits: int) -> np.ndarray:
        """`values` (integers mod 2^bits, words [start, start + n) of `stream`) with the pairwise masks:
        + PRG(k_ij) for each peer j after this site in name order, - for each before it."""
        total = values.astype(np.uint32).reshape(-1).copy()
        for peer, key in self.keys.items():
            words = keystream_words(key, stream, start, total.size)
            total = total + words if peer > self.site else total - words  # uint32 wraps: mod 2^32
        return total & np.uint32(2**bits - 1)


def keystream_words(key: bytes, stream: str, start: int, count: int) -> np.ndarray:
    """Words [start, start + count) of ChaCha20's keystream under `key` for `stream` (uint32)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    block, skip = divmod(start, _WORDS_PER_BLOCK)
    nonce = block.to_bytes(4, "little") + hashlib.sha256(stream.encode()).digest()[:12]
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    data = encryptor.update(bytes(4 * (skip + count)))
    return np.frombuffer(data, dtype="<u4")[skip:].astype(np.uint32)
