"""The change a blockwise (int8, int4) transfer package holds, decoded from the format as
docs/federated/transfers.md states it, not through supertune's reader: the tests compare the two."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from supertune.transfer import PACKAGE_MANIFEST


def decoded_change(package_dir: Path, block: int) -> dict[str, np.ndarray]:
    """The change an int8 or int4 package holds, decoded from the format as docs/federated/transfers.md states it
    (not through supertune): int4 packs (q + 8) of the even element in the low 4 bits, the odd in the high."""
    stored = load_file(str(package_dir / "transfer.safetensors"))
    manifest = json.loads((package_dir / PACKAGE_MANIFEST).read_text())
    out = {}
    for name, t in manifest["tensors"].items():
        numel = int(np.prod(t["shape"]))
        if t["dtype"] != "F32":
            out[name] = stored[name]
            continue
        q = stored[name]
        if manifest["codec"] == "int4":
            q = np.stack([q & 15, q >> 4], axis=1).reshape(-1).astype(np.int16) - 8
        scale = stored[name + ":absmax_scale"]
        out[name] = (q.astype(np.float32).reshape(-1, block) * scale[:, None]).reshape(-1)[:numel].reshape(t["shape"])
    return out
