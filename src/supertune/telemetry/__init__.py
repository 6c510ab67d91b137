"""Throughput, FLOPs and MFU of training runs; scaling sweeps and their reports.

- `flops`: FLOPs per token of a Hugging Face causal LM from its config (formula FORMULA).
- `peaks`: peak FLOP/s per device and dtype (the cluster profile's first), the MFU denominator.
- `meter`, `callback`: what a run measures every logging step (metrics.jsonl, TensorBoard, summary.json).
- `scales`, `sweep`: `supertune sweep`, one run per scale; `report`, `plots`: `supertune report`.

Importing this package imports neither torch nor matplotlib; `callback` imports transformers.
"""

from .flops import FORMULA, Architecture, FlopCount, UnsupportedModel, architecture, flop_count
from .peaks import PEAKS, DevicePeak, PeakChoice, choose_peak
from .scales import Scale, plan_scales

__all__ = [
    "FORMULA",
    "PEAKS",
    "Architecture",
    "DevicePeak",
    "FlopCount",
    "PeakChoice",
    "Scale",
    "UnsupportedModel",
    "architecture",
    "choose_peak",
    "flop_count",
    "plan_scales",
]
