"""What a site's agent and the coordinator agree on in a round of secure aggregation (executor:
agents, privacy.secure_aggregation; docs/federated/privacy.md, "Secure aggregation"): the round's set
of sites, the secure sum over them, the headers each upload must carry, and the tensors it holds.

A round is, at the exchange (exchange_layout.py names the files):

1. each training site's agent posts its public key (`key-NNN.json`) and checks every peer's posted key
   against the key the federation pins for that peer: one that differs stops the agent in one line
   naming the site, before it trains or uploads anything;
2. after training, each posts its masked block-scale integers (`scales-NNN-A/scales.upload`) with its
   tokens and samples; the coordinator sums them (the sum is the shared scales, nothing of one site)
   and posts the sum with each site's weight fraction (`global/scales-NNN-A`);
3. each posts its masked values (`values-NNN-A/values.upload`), encoded on the shared scales at its
   fraction; the coordinator sums them, decodes the weighted average change and applies it to the
   round's global model as the delta path does (server optimizer included).

The masks are made for one set, the coordinator's (`global/secure-NNN.json`): a site of it that fails
(its agent reports a failed training, or it has not uploaded by the round's deadline) would leave the
sum as noise, since the others masked against it. So the coordinator fixes the remaining set, down to
aggregation.min_sites, as the next attempt, and every remaining site uploads both phases again, masked
under the next attempt's keys (HKDF binds a mask to its attempt: no mask is used twice). Each attempt
after the first has a deadline of its own, as long as the round's, from when it is set.
"""

from __future__ import annotations

import numpy as np

from ....transfer.codec import FLOAT_DTYPES
from ....transfer.secure_masks import MaskContext
from ....transfer.secure_sum import SecureSum
from ....transfer.secure_upload import UploadHeader
from ....weight_files.dtypes import accumulator_dtype, widen_into
from ...config.schema import FederationConfig

__all__ = ["SCALES_FILE", "VALUES_FILE", "SCALE_SUM_FILE", "COORDINATOR", "round_sites", "secure_sum",
           "mask_context", "upload_header", "float_tensors", "read_tensor"]  # fmt: skip

SCALES_FILE = "scales.upload"
VALUES_FILE = "values.upload"
SCALE_SUM_FILE = "scales.sum"
COORDINATOR = "(coordinator)"
"""The `site` of the coordinator's scale sum header: not a site name (names are letters, digits, -, _)."""


def round_sites(fed: FederationConfig, number: int, left_out: dict | None = None) -> tuple[str, ...]:
    """The sites of round `number`'s secure sum, in name order: those that train in it, less those the
    coordinator left out before its training (--skip-site)."""
    return tuple(sorted(s.name for s in fed.sites if s.in_round(number) and s.name not in (left_out or {})))


def secure_sum(fed: FederationConfig, sites: tuple[str, ...]) -> SecureSum:
    return SecureSum(fed.transfer.dtype, len(sites), fed.transfer.block_size)


def mask_context(fed: FederationConfig, number: int, attempt: int) -> MaskContext:
    return MaskContext(fed.name, number, attempt)


def upload_header(
    fed: FederationConfig, number: int, attempt: int, phase: str, site: str, sites: tuple[str, ...], bits: int,
    tensors: list[tuple[str, int]],
) -> UploadHeader:  # fmt: skip
    return UploadHeader(fed.name, number, attempt, phase, site, tuple(sites), bits, tuple(tensors))


def float_tensors(weights) -> list[tuple[str, int]]:
    """(name, numel) of every float tensor of `weights` (averaging.inputs' weights), in file order: what a
    secure sum carries. Other tensors (integer buffers) do not train; the global model keeps its own."""
    out = []
    for name in weights.in_file_order():
        entry = weights.entry(name)
        if entry.dtype in FLOAT_DTYPES:
            out.append((name, entry.numel))
    return out


def read_tensor(weights, name: str) -> np.ndarray:
    """One tensor of `weights`, widened to float32 (float64 for F64), flat: one tensor in memory at a time."""
    entry = weights.entry(name)
    out = widen_into(
        weights.rows(name, 0, entry.numel), entry.dtype, np.empty(entry.numel, accumulator_dtype(entry.dtype))
    )
    weights.release(name, 0, entry.numel)
    return out
