"""Step accounting: optimizer steps (time, time waiting for data, tokens) summed into the figures a
run logs. Pure arithmetic, no torch; the Trainer callbacks (telemetry.callback) feed it.

A step's time runs from the end of the previous step's bookkeeping (its callbacks, and logging,
evaluation and checkpoint saving when they happen, which are left out) to the end of this step's
callbacks. Its data wait is the part before the first forward: the Trainer fetching and collating
the step's micro-batches. Tokens are the Trainer's count of non-padding input tokens over all
processes and all micro-batches of the step (gradient accumulation included).
"""

from __future__ import annotations

from dataclasses import dataclass

from .flops import FlopCount

__all__ = ["Window", "throughput_figures"]


@dataclass
class Window:
    """Some optimizer steps, added up."""

    steps: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    tokens: int = 0

    def add(self, seconds: float, wait_s: float, tokens: int) -> None:
        self.steps += 1
        self.seconds += seconds
        self.wait_s += wait_s
        self.tokens += tokens


def throughput_figures(
    window: Window, world_size: int, count: FlopCount | None, peak_tflops: float | None
) -> dict[str, float]:
    """Tokens/s (global and per device), step time, tokens per step, data-wait share and, where a
    FLOP count is known, TFLOP/s per device; MFU (and HFU) where a peak is known too. Empty when
    the window holds no time."""
    if window.steps == 0 or window.seconds <= 0:
        return {}
    per_second = window.tokens / window.seconds
    figures = {
        "throughput_tokens_per_s": per_second,
        "throughput_tokens_per_s_per_device": per_second / world_size,
        "step_time_s": window.seconds / window.steps,
        "tokens_per_step": window.tokens / window.steps,
        "data_wait_share": window.wait_s / window.seconds,
    }
    if count is not None:
        # Each device does 1/world_size of the global tokens' work: FLOP/s per device, never global
        # FLOP/s over one device's peak.
        model = per_second * count.training / world_size / 1e12
        figures["tflops_per_device"] = model
        if count.recompute:
            figures["hardware_tflops_per_device"] = per_second * count.hardware / world_size / 1e12
        if peak_tflops:
            figures["mfu"] = model / peak_tflops
            if count.recompute:
                figures["hfu"] = figures["hardware_tflops_per_device"] / peak_tflops
    return figures
