"""What a site sends after its training when the federation has transfer settings: its checkpoint's
weights, or with `transfer.delta` their change from the round's global model, encoded into a transfer
package (supertune.transfer) in its folder of the round, `round-NNN/<site>/sent/`.

Error feedback: the package also keeps, at the site and never sent, what the codec lost of the change
(the residual); the site's next package adds it to its change before encoding, so what one round
rounds away is sent in a later one. The residual comes from the site's latest earlier package (a
round it sat out keeps it waiting). A package is published whole by one rename, so a federation
killed while one is written makes it again from the same inputs, bit for bit.

With privacy settings the change, error feedback included, is clipped to privacy.clip_norm and noised
(supertune.transfer.privacy) before it is encoded, with noise drawn from the site's own secret key
(state/noise_key.py): the package is the only thing of the change that leaves the site, and it is
already private; the residual is what the codec lost of the noised change.

With the built-in executor the package is made by the federation's process, which reads the site's
checkpoint where it lies: its bytes are what the site would send, and the average reads the package,
not the checkpoint, so what the round averages is what travelled.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...averaging.inputs import cached_digest, resolve_input
from ...errors import UserError
from ...transfer import PACKAGE_MANIFEST, ChangeNoise, Codec, Package, read_package, write_package
from ...weight_files.tensor_files import TensorFile
from ..config.privacy import site_noise_std
from ..config.schema import FederationConfig
from ..state.layout import FederationDir
from ..state.noise_key import site_noise_key

__all__ = ["send_result"]

log = logging.getLogger("supertune")


def send_result(
    fed: FederationConfig,
    root: FederationDir,
    number: int,
    site: str,
    checkpoint: str,
    previous: Path,
    everyone: FederationConfig | None = None,
) -> Package:
    """The site's package of round `number` (made now unless a finished one is there): its checkpoint's
    weights encoded as fed.transfer says, a change from `previous` (the round's starting global model),
    clipped and noised as fed.privacy says; `everyone` (default `fed`): the federation whose sites of
    the round share the noise (a site agent's `fed` holds only its own site)."""
    out = root.round(number).site(site).sent
    if (out / PACKAGE_MANIFEST).is_file():  # published whole: a kill cannot leave half of one here
        return read_package(out)
    t = fed.transfer
    label = f"{site} round {number}"
    source = resolve_input(checkpoint)
    base = resolve_input(previous) if t.delta else None
    residual = _last_residual(root, number, site, label) if t.delta else None
    privacy = None
    if fed.privacy.active and base is not None:
        base_digest = cached_digest(base.weights)
        # Another change (a site's folder of the round deleted and trained again) gets other noise.
        key = site_noise_key(root, site, fed.seed, number, sorted(cached_digest(source.weights).items()),
                             sorted(base_digest.items()))  # fmt: skip
        privacy = ChangeNoise(float(fed.privacy.clip_norm or 0.0), site_noise_std(everyone or fed, number), key)
    try:
        package = write_package(
            out,
            source.weights,
            Codec(t.dtype, t.block_size),
            base=base.weights if base else None,
            base_digest=cached_digest(base.weights) if base else None,
            residual=residual,
            side_files=[source.directory / name for name in source.side_files],
            counts={"tokens": source.tokens, "samples": source.samples, "site": site, "round": number},
            label=label,
            privacy=privacy,
        )
    finally:
        if residual is not None:
            residual.close()
    if privacy is not None and privacy.norm is not None:  # the site's own log: the norm is never sent
        log.info("%s: its change's L2 norm %.4g, clipped to %.4g, noise std %.3g a value", label, privacy.norm,
                 min(privacy.norm, privacy.clip_norm), privacy.noise_std)  # fmt: skip
    return package


def _last_residual(root: FederationDir, number: int, site: str, label: str) -> TensorFile | None:
    """The residual of the site's latest package before round `number`, or None (its first package, or
    a lossless one)."""
    for earlier in range(number - 1, 0, -1):
        sent = root.round(earlier).site(site).sent
        if not (sent / PACKAGE_MANIFEST).is_file():
            continue  # the site sat that round out, or the round's folder was deleted
        kept = read_package(sent, f"{site} round {earlier}").residual
        if not kept:
            return None
        path = sent / str(kept["file"])
        if not path.is_file() or path.stat().st_size != kept.get("size"):
            raise UserError(
                f"{label}: the residual of round {earlier} ({path}) is missing or not the size its package records; "
                f"delete {sent} to make that round's package again"
            )
        return TensorFile(path)
    return None
