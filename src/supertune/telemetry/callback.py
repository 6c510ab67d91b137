"""Throughput, FLOPs and MFU of a training run, measured by two Trainer callbacks.

`StepClock` goes last among the callbacks, so a step's time includes the others' per-step work
(the stop agreement's all_reduce, for one) and the bookkeeping after a logging step does not count
as waiting for data. `ThroughputFields` goes first: at every logging step it adds the figures of the
steps since the previous one to the Trainer's log record, which the callbacks after it write to
metrics.jsonl (MetricsFile) and TensorBoard. Times are host clocks: on a GPU, fetching data while
the optimizer's kernels still run counts as waiting, so the data-wait share is an upper bound.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from ..config.schema import RunConfig
from ..launch.environment import LaunchEnvironment
from .flops import FlopCount, UnsupportedModel, architecture, fit_to_model, flop_count, recomputed_share
from .meter import Window, throughput_figures
from .peaks import PeakChoice, choose_peak, compute_dtype

__all__ = ["StepClock", "Telemetry", "ThroughputFields"]

log = logging.getLogger("supertune")


class StepClock(TrainerCallback):
    """Times every optimizer step and counts its tokens; register it after every other callback.
    `clock`: seconds from any origin (time.perf_counter; a test gives a clock it advances itself)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.window = Window()
        """Steps since the last logging step."""
        self.run = Window()
        """Steps of this process after its first (which pays for warm-up); the run's figures."""
        self.first = Window()
        self.ready = self.began = 0.0
        self.wait_s = 0.0
        self.tokens_before = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ready = self.clock()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = self.clock()
        self.wait_s = self.began - self.ready
        self.tokens_before = int(state.num_input_tokens_seen or 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = self.clock()
        seconds, tokens = now - self.ready, int(state.num_input_tokens_seen or 0) - self.tokens_before
        self.window.add(seconds, self.wait_s, tokens)
        (self.run if self.first.steps else self.first).add(seconds, self.wait_s, tokens)
        self.ready = now

    def _bookkeeping_done(self, *args: Any, **kwargs: Any) -> None:
        self.ready = self.clock()

    # Logging, evaluation and saving happen between steps; none of it is a training step's time.
    on_log = on_evaluate = on_save = _bookkeeping_done

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

    def run_window(self) -> Window:
        return self.run if self.run.steps else self.first


class ThroughputFields(TrainerCallback):
    """Adds the throughput figures to every training log record; register it before MetricsFile."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return  # evaluation records and the Trainer's end-of-training record
        figures = self.telemetry.figures(self.telemetry.clock.take_window())
        logs.update({k: float(f"{v:.6g}") for k, v in figures.items() if v is not None})


class Telemetry:
    """What a run knows about its speed: the FLOP count, the peak, the devices, and its two callbacks."""

    def __init__(
        self,
        count: FlopCount | None,
        count_note: str | None,
        peak: PeakChoice,
        device_name: str | None,
        env: LaunchEnvironment,
    ) -> None:
        self.count = count
        self.count_note = count_note
        """Why there is no FLOP count, or what is uncertain about it; None when nothing is."""
        self.peak = peak
        self.device_name = device_name
        self.world_size = env.world_size
        self.nodes = env.num_nodes
        self.is_main = env.is_main
        self.clock = StepClock()
        self.fields = ThroughputFields(self)
        self._warned_above_peak = False

    @classmethod
    def for_run(cls, cfg: RunConfig, model: Any, data: Any, env: LaunchEnvironment) -> Telemetry:
        """The telemetry of a run training `model` on `data` (a TrainingData)."""
        import torch

        # The length of the sequences the model sees: the packed block, or the padded length.
        # Preference rows: sequences of at most max_length, padded or packed side by side (apart).
        packed = cfg.data.packing and cfg.training.objective == "sft"
        sequence_length = cfg.data.block_size if packed else (data.max_length or cfg.data.block_size)
        count, note = None, None
        try:
            arch, note = fit_to_model(architecture(model.config), model)
            m = cfg.model
            recompute = (
                recomputed_share(arch.layers, m.gradient_checkpointing_every) if m.gradient_checkpointing else 0.0
            )
            count = flop_count(arch, sequence_length, frozen_weights=m.lora.enabled, recompute=recompute)
        except UnsupportedModel as exc:
            note = str(exc)
        device_name = torch.cuda.get_device_name(env.device_index) if torch.cuda.is_available() else None
        mixed = "bf16" if cfg.training.bf16 else "fp16" if cfg.training.fp16 else "no"
        dtype = compute_dtype(
            mixed, cfg.model.dtype, torch.cuda.is_available() and torch.backends.cuda.matmul.allow_tf32
        )
        peak = choose_peak(device_name, dtype, _profile(cfg.launch.cluster))
        return cls(count, note, peak, device_name, env)

    @property
    def devices(self) -> str:
        return f"{self.world_size} x {self.device_name or 'CPU'}"

    def plan_line(self) -> str:
        """The startup log's line: devices, FLOPs per token and the formula, the peak (or why no MFU)."""
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        if self.count is not None:
            c = self.count
            times = (
                f"{c.training / c.forward:.2f}" if c.frozen_weights else "3"
            )  # LoRA: frozen weights have no weight gradients
            flops = f"FLOPs per token {_si(c.training)} (training = {times} x {_si(c.forward)} forward at sequence {c.sequence_length}"
            flops += f"; hardware {_si(c.hardware)} with recomputation)" if c.recompute else ")"
            flops += f" [{c.describe()}]"
        else:
            flops = f"FLOPs per token unknown ({self.count_note}): no TFLOP/s, no MFU"
        if self.peak.tflops:
            peak = f"MFU against {self.peak.tflops:g} TFLOP/s per device ({self.peak.source})"
        else:
            peak = f"MFU not reported: {self.peak.source}"
        return f"devices {self.devices} on {nodes}; {flops}; {peak}"

    def log_plan(self) -> None:
        """Said once, by the main process: the plan line and any doubt about the numbers."""
        if not self.is_main:
            return
        log.info("%s", self.plan_line())
        if self.count is not None and self.count_note:
            log.warning("%s", self.count_note)
        if self.peak.warning:
            log.warning("%s", self.peak.warning)

    def figures(self, window: Window) -> dict[str, float | None]:
        figures: dict[str, float | None] = dict(
            throughput_figures(window, self.world_size, self.count, self.peak.tflops)
        )
        mfu = figures.get("mfu")
        if mfu is not None and mfu > 1 and not self._warned_above_peak and self.is_main:
            self._warned_above_peak = True
            log.warning(
                "MFU %.0f %% is above 100 %%: the peak (%g TFLOP/s, %s) is lower than this device's, or the FLOP count is wrong",
                100 * mfu, self.peak.tflops, self.peak.source,
            )  # fmt: skip
        figures["peak_device_memory_gb"] = _peak_device_memory_gb()
        return figures

    def summary_fields(self) -> dict[str, Any]:
        """The same figures over the whole run (this process's steps after its first), the formula and the peak."""
        window = self.clock.run_window()
        keys = (
            "throughput_tokens_per_s", "throughput_tokens_per_s_per_device", "step_time_s", "tokens_per_step",
            "data_wait_share", "tflops_per_device", "hardware_tflops_per_device", "mfu", "hfu", "peak_device_memory_gb",
        )  # fmt: skip
        figures = self.figures(window)
        c = self.count
        return {
            **{k: figures.get(k) for k in keys},
            "peak_host_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "measured_steps": window.steps,
            "devices": self.devices,
            "device_name": self.device_name or "CPU",
            "nodes": self.nodes,
            "flops_formula": c.describe() if c else None,
            "flops_note": self.count_note,
            "flops_per_token": c.training if c else None,
            "flops_per_token_forward": c.forward if c else None,
            "hardware_flops_per_token": c.hardware if c else None,
            "flops_sequence_length": c.sequence_length if c else None,
            "peak_tflops_per_device": self.peak.tflops,
            "peak_dtype": self.peak.dtype,
            "peak_source": self.peak.source,
        }


def _profile(name: str) -> Any | None:
    """The run's cluster profile, or None when it cannot be read here (MFU then uses the table)."""
    from ..clusters import load_profile
    from ..errors import UserError

    try:
        return load_profile(name)
    except UserError as exc:
        log.warning("cluster profile %s not readable here (%s): the peak FLOP/s comes from the device table", name, exc)
        return None


def _peak_device_memory_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


def _si(flops: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"
