"""What a training run measures: throughput, FLOPs and MFU.

- `flops`: FLOPs per token of a Hugging Face causal LM from its config (formula FORMULA).
- `peaks`: peak FLOP/s per device and dtype (the cluster profile's first), the MFU denominator.
- `meter`, `callback`: what a run measures every logging step (metrics.jsonl, TensorBoard, summary.json).

Importing this package imports neither torch nor matplotlib; `callback` imports transformers.
"""

from .flops import FORMULA, Architecture, FlopCount, UnsupportedModel, architecture, flop_count
from .peaks import PEAKS, DevicePeak, PeakChoice, choose_peak

__all__ = [
    "FORMULA",
    "PEAKS",
    "Architecture",
    "DevicePeak",
    "FlopCount",
    "PeakChoice",
    "UnsupportedModel",
    "architecture",
    "choose_peak",
    "flop_count",
]
