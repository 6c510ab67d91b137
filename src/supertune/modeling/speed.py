"""training.speed: which exact speed-ups a run takes, decided once from the model, the strategy and the device.

Each speed-up is a record of SPEEDUPS, named as in supertune.config.speed_pieces: why it cannot run
in this run (None when it can) and how it is applied: to the model, or as TrainingArguments keywords
the Trainer is built with (SpeedChoice.trainer_arguments). `auto` takes every one that can
run here and is not named in training.speed_skip; `plain` takes none. The choice is said in one line
at the start of the run and recorded in summary.json under `speed`, with the reason for each
speed-up left out, so a run's speed can be explained from its own directory. training.float8, not
exact and so never one of these, is applied here too when it is set, before them, so that they see
the model it trains, and said and recorded with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config.speed_pieces import SPEED_PIECES
from .chunked_loss import unfit_reason, use_chunked_loss
from .compiled_layers import compile_layers, compile_unfit_reason
from .flex_documents import flex_unfit_reason, use_flex_documents
from .float8 import use_float8

__all__ = ["SPEEDUPS", "SpeedChoice", "Speedup", "RunFacts", "take_speedups"]


@dataclass(frozen=True)
class RunFacts:
    """What decides whether a speed-up can run."""

    strategy: str
    """distributed.strategy"""
    device: str
    """"cuda" or "cpu": where the model trains."""
    optim: str = "adamw_torch"
    """training.optim"""
    document_mask: bool = False
    """data.packing and data.document_mask: training rows of whole documents, kept apart by their position ids."""
    torch_compile: bool = False
    """training.torch_compile: the Trainer compiles the whole model."""


@dataclass(frozen=True)
class Speedup:
    name: str
    unavailable: Callable[[Any, RunFacts], str | None]
    """Why it cannot run for this model and run, or None."""
    apply: Callable[[Any, dict[str, Any]], None]
    """Applies it: to the model, or into the TrainingArguments keywords (the dict)."""


def _chunked_unavailable(model: Any, facts: RunFacts) -> str | None:
    if facts.strategy != "ddp":
        # ZeRO-3 and FSDP gather the output layer's weight in that layer's own forward, which the
        # chunked loss does not call; the other ZeRO stages are left out until they are tested.
        return f"distributed.strategy={facts.strategy}: runs under ddp only"
    return unfit_reason(model)


def _fused_adamw_unavailable(model: Any, facts: RunFacts) -> str | None:
    if facts.optim != "adamw_torch":
        return f"training.optim={facts.optim}: replaces adamw_torch only"
    if facts.strategy != "ddp":
        # DeepSpeed steps its own optimizer; FSDP's DTensor parameters are left out until tested.
        return f"distributed.strategy={facts.strategy}: runs under ddp only"
    return None


def _flex_unavailable(model: Any, facts: RunFacts) -> str | None:
    if not facts.document_mask:
        return "data.document_mask=false: only document-masked packing has a block mask to use"
    if facts.device != "cuda":
        # PyTorch refuses flex attention's backward on CPU; uncompiled it would also be slower than
        # SDPA there (3x for the embedded model's forward and backward, docs/speed.md).
        return f"{facts.device.upper()}: flex attention trains on CUDA only"
    # Any distributed.strategy: the attention holds no parameters, which is all that ZeRO and FSDP shard.
    return flex_unfit_reason(model)


def _compile_unavailable(model: Any, facts: RunFacts) -> str | None:
    if facts.torch_compile:
        return "training.torch_compile=true: the Trainer compiles the whole model already"
    if facts.device != "cuda":
        # Measured (docs/speed.md): the embedded model's 8 x 512-token step, one thread, took 2.2-2.3 s
        # compiled against 1.6 s eager, after 60-100 s of building C++ kernels: no gain to pay for.
        return f"{facts.device.upper()}: compiled layers were slower than eager here, after a minute of compiling; CUDA only"
    if facts.strategy in ("zero1", "zero2", "zero3"):
        # ZeRO-3 gathers each parameter in hooks on the modules inside the layers, which a compiled
        # layer would trace into; ZeRO-1/2 are left out until they are tested.
        return f"distributed.strategy={facts.strategy}: runs under ddp and fsdp only"
    return compile_unfit_reason(model)


SPEEDUPS: dict[str, Speedup] = {
    s.name: s
    for s in (
        Speedup("chunked_cross_entropy", _chunked_unavailable, lambda model, arguments: use_chunked_loss(model)),
        # The same AdamW update in one kernel over all parameters instead of a loop of kernels per
        # parameter group (torch.optim.AdamW(fused=True), on CPU as on CUDA).
        Speedup(
            "fused_adamw",
            _fused_adamw_unavailable,
            lambda model, arguments: arguments.update(optim="adamw_torch_fused"),
        ),
        Speedup("flex_document_mask", _flex_unavailable, lambda model, arguments: use_flex_documents(model)),
        Speedup("compile", _compile_unavailable, lambda model, arguments: compile_layers(model)),
    )
}


@dataclass
class SpeedChoice:
    mode: str
    device: str
    taken: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    """name -> why"""
    trainer_arguments: dict[str, Any] = field(default_factory=dict)
    """TrainingArguments keywords the speed-ups taken set (over the run config's)."""
    float8_linears: int | None = None
    """With training.float8: how many linear layers train in float8; None without it."""

    def line(self) -> str:
        taken = ", ".join(self.taken) or "none"
        left = "; ".join(f"{name} ({why})" for name, why in self.left_out.items())
        float8 = (
            "" if self.float8_linears is None else f"; float8: {self.float8_linears} linear layers (training.float8)"
        )
        return f"speed: {self.mode} on {self.device.upper()}: {taken}{float8}" + (f"; left out: {left}" if left else "")

    def record(self) -> dict[str, Any]:
        record = {"mode": self.mode, "device": self.device, "taken": list(self.taken), "left_out": dict(self.left_out)}
        return record if self.float8_linears is None else {**record, "float8_linears": self.float8_linears}


def take_speedups(model: Any, mode: str, skip: list[str], facts: RunFacts, float8: bool = False) -> SpeedChoice:
    """Apply to `model` every speed-up `mode` (training.speed) allows here, less those in `skip`; with
    `float8` (training.float8, whatever the mode), first its decoder layers' linear layers in float8."""
    choice = SpeedChoice(mode, facts.device)
    if float8:
        choice.float8_linears = use_float8(model)
    for name in SPEED_PIECES:
        speedup = SPEEDUPS[name]
        if mode == "plain":
            why: str | None = "training.speed=plain"
        elif name in skip:
            why = "training.speed_skip"
        else:
            why = speedup.unavailable(model, facts)
        if why is None:
            speedup.apply(model, choice.trainer_arguments)
            choice.taken.append(name)
        else:
            choice.left_out[name] = why
    return choice
