"""The Gaussian mechanism on a site's change, before it is encoded: clipped to an L2 norm, then noised.

The change (every floating-point tensor of it, with the error feedback the site kept) is scaled by
min(1, clip_norm / ||change||), its L2 norm taken over all its tensors together; then every value gets
independent Gaussian noise of standard deviation `noise_std`. What the codec then loses of the noised
change is the next residual: it is computed from the noised values only, so the error feedback adds
nothing the mechanism has not already covered.

The noise is drawn from a generator keyed by `key`, a secret of the site (never sent), and by the
tensor's name and the position of its values, in chunks of NOISE_CHUNK values: the same key draws the
same noise whatever the order or slicing of the reads, so a package written twice (the scales pass
and the values pass of int8, or a write killed and done again) holds the same bytes.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ChangeNoise", "NOISE_CHUNK"]

NOISE_CHUNK = 1 << 20
"""Values of a tensor drawn from one generator (4 MB of float32)."""


@dataclass
class ChangeNoise:
    """What a site does to its change before it is encoded: clip to `clip_norm`, add N(0, noise_std^2)."""

    clip_norm: float
    noise_std: float
    key: bytes
    """The noise generator's key: secret to the site; the same key draws the same noise."""
    norm: float | None = None
    """The change's L2 norm before clipping, once measured (for the site's own log: it is never sent)."""
    _chunk: tuple[str, int, np.ndarray] | None = field(default=None, repr=False)

    def measure(self, sum_of_squares: float) -> float:
        """Keep the change's norm from its sum of squares; the factor it is scaled by: 1 when the norm is
        within clip_norm, else clip_norm / norm."""
        self.norm = math.sqrt(sum_of_squares)
        return 1.0 if self.norm <= self.clip_norm else self.clip_norm / self.norm

    def noise(self, name: str, numel: int, start: int, stop: int) -> np.ndarray:
        """The noise of values [start, stop) of tensor `name` (of `numel` values), float32."""
        out = np.empty(stop - start, np.float32)
        if self.noise_std == 0:
            out[:] = 0
            return out
        at = start
        while at < stop:
            index = at // NOISE_CHUNK
            chunk = self._drawn(name, numel, index)
            first = at - index * NOISE_CHUNK
            take = min(stop - at, chunk.size - first)
            out[at - start : at - start + take] = chunk[first : first + take]
            at += take
        return out

    def _drawn(self, name: str, numel: int, index: int) -> np.ndarray:
        """Chunk `index` of the tensor's noise; the last one drawn is kept (a slice that starts in it
        is read again by the next)."""
        if self._chunk is not None and self._chunk[:2] == (name, index):
            return self._chunk[2]
        size = min(NOISE_CHUNK, numel - index * NOISE_CHUNK)
        seed = hashlib.sha256(self.key + b"\0" + name.encode() + b"\0" + str(index).encode()).digest()
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
        chunk = rng.standard_normal(size, dtype=np.float32)
        chunk *= np.float32(self.noise_std)
        self._chunk = (name, index, chunk)
        return chunk
