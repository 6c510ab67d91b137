"""Peak FLOP/s of one device, the denominator of MFU: the cluster profile's figure first, else a
table keyed by the device's name and the compute dtype, else none (and then no MFU).

Every figure is the dense peak (no 2:4 structured sparsity, which doubles the datasheet numbers
and which training does not use), of one device as PyTorch sees it (an MI250X module is two GCDs,
two devices). The table is data with a source per row; a site's own figure belongs in its
cluster profile (`peak_bf16_tflops_per_gpu`), which wins. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["PEAKS", "DevicePeak", "PeakChoice", "choose_peak", "compute_dtype", "table_peak"]


@dataclass(frozen=True)
class DevicePeak:
    """One device's dense peaks in TFLOP/s per compute dtype, and where they come from."""

    name: str
    pattern: str
    """Regular expression matched (case-insensitively) against torch.cuda.get_device_name()."""
    tflops: dict[str, float]
    """bf16, fp16, tf32 (fp32 matmuls on tensor cores) and fp32 (without them)."""
    source: str


# Order matters: the first pattern that matches the device name wins (GH200 before H200, NVL and
# PCIe before the SXM part).
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("NVIDIA GH200", r"GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
               "NVIDIA GH200 Grace Hopper Superchip datasheet (H100 SXM5 GPU): dense tensor peaks"),
    DevicePeak("NVIDIA H200 NVL", r"H200.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
               "NVIDIA H200 datasheet, H200 NVL column: 1,671 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA H200", r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
               "NVIDIA H200 datasheet, H200 SXM column: 1,979 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA H100 NVL", r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
               "NVIDIA H100 datasheet, H100 NVL column: 1,671 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA H100 PCIe", r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
               "NVIDIA H100 datasheet, H100 PCIe column: 1,513 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA H100 SXM", r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
               "NVIDIA H100 datasheet, H100 SXM column: 1,979 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA A100", r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
               "NVIDIA A100 datasheet (SXM and PCIe alike): 312 TFLOP/s bf16 dense, 624 with sparsity"),
    DevicePeak("NVIDIA L40S", r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
               "NVIDIA L40S datasheet: 733 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA A40", r"\bA40\b", {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4},
               "NVIDIA A40 datasheet: 149.7 TFLOP/s bf16 dense (299.4 with sparsity)"),
    DevicePeak("NVIDIA L4", r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
               "NVIDIA L4 datasheet: 242 TFLOP/s bf16 with sparsity, halved"),
    DevicePeak("NVIDIA V100", r"V100", {"fp16": 125.0, "fp32": 15.7},
               "NVIDIA V100 datasheet, SXM2: 125 TFLOP/s fp16 tensor, dense (no sparsity on V100; PCIe: 112), no bf16"),
    DevicePeak("AMD Instinct MI300X", r"MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4},
               "AMD Instinct MI300X data sheet: 1,307.4 TFLOP/s bf16 dense (2,614.9 with sparsity)"),
    DevicePeak("AMD Instinct MI300A", r"MI300A", {"bf16": 980.6, "fp16": 980.6, "tf32": 490.3, "fp32": 122.6},
               "AMD Instinct MI300A data sheet: 980.6 TFLOP/s bf16 dense (1,961.2 with sparsity)"),
    DevicePeak("AMD Instinct MI250X GCD", r"MI250X", {"bf16": 191.5, "fp16": 191.5, "fp32": 47.9},
               "AMD Instinct MI250X data sheet: 383 TFLOP/s bf16 dense per module of two GCDs, halved: PyTorch sees each GCD as a device"),
    DevicePeak("AMD Instinct MI250 GCD", r"MI250", {"bf16": 181.0, "fp16": 181.0, "fp32": 45.3},
               "AMD Instinct MI250 data sheet: 362.1 TFLOP/s bf16 dense per module of two GCDs, halved"),
)  # fmt: skip


@dataclass(frozen=True)
class PeakChoice:
    """The peak MFU divides by (TFLOP/s of one device), or None with the reason."""

    tflops: float | None
    source: str
    """Where the figure came from, or why there is none."""
    dtype: str
    warning: str | None = None
    """Said once in the log: the profile's figure disagrees with the table's for the device found."""


def compute_dtype(mixed_precision: str, weights_dtype: str, tf32_matmuls: bool) -> str:
    """The dtype matmuls run in: the mixed precision, else the weights' (fp32 on tensor cores is tf32)."""
    if mixed_precision in ("bf16", "fp16"):
        return mixed_precision
    if weights_dtype in ("bf16", "fp16"):
        return weights_dtype
    return "tf32" if tf32_matmuls else "fp32"


def table_peak(device_name: str, dtype: str) -> tuple[DevicePeak | None, float | None]:
    """The table's row for a device name, and its figure for dtype (None where the row has none)."""
    for row in PEAKS:
        if re.search(row.pattern, device_name, re.IGNORECASE):
            return row, row.tflops.get(dtype)
    return None, None


def choose_peak(device_name: str | None, dtype: str, profile: Any | None = None) -> PeakChoice:
    """The peak for `dtype` on a device named `device_name` (None: CPU), under a cluster profile.

    The profile's `peak_bf16_tflops_per_gpu` is its half-precision tensor peak (bf16, or fp16 on
    V100 sites): it is used for bf16 and fp16, never for fp32 or tf32.
    """
    if device_name is None:
        return PeakChoice(None, "CPU: no peak FLOP/s for CPUs, so no MFU", dtype)
    row, figure = table_peak(device_name, dtype)
    profile_peak = float(getattr(profile, "peak_bf16_tflops_per_gpu", 0) or 0)
    if profile_peak > 0 and dtype in ("bf16", "fp16"):
        source = f"cluster profile {profile.name}: peak_bf16_tflops_per_gpu"
        warning = None
        if figure and abs(profile_peak - figure) / figure > 0.1:
            warning = (
                f"the cluster profile {profile.name} gives {profile_peak:g} TFLOP/s per GPU but this process runs on "
                f"{device_name} ({row.name}: {figure:g} TFLOP/s {dtype} dense): MFU uses the profile's figure; "
                f"correct peak_bf16_tflops_per_gpu if the profile is wrong"
            )
        return PeakChoice(profile_peak, source, dtype, warning)
    if row is None:
        return PeakChoice(
            None,
            f"no peak known for {device_name!r} (set peak_bf16_tflops_per_gpu in the cluster profile), so no MFU",
            dtype,
        )
    if figure is None:
        return PeakChoice(None, f"{row.name} has no {dtype} peak in the table, so no MFU", dtype)
    return PeakChoice(figure, f"{row.name} {dtype} dense: {row.source}", dtype)
