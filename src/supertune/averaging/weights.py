"""The weight of each input in the average: tokens seen (the default), samples seen, equal, or given."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UserError
from .checks import joined_problems
from .inputs import ModelInput

__all__ = ["InputWeights", "WEIGHT_MODES", "parse_weights", "input_weights"]

WEIGHT_MODES = ("tokens", "samples", "uniform")


@dataclass(frozen=True)
class InputWeights:
    mode: str
    """tokens, samples, uniform or explicit."""
    raw: tuple[float, ...]
    """Before normalising: tokens, samples, 1 each, or the numbers given."""
    normalised: tuple[float, ...]
    """raw / sum(raw): what each input is multiplied by."""


def parse_weights(text: str | Sequence[float]) -> str | tuple[float, ...]:
    """'tokens', 'samples', 'uniform', or 'w1,w2,...' (numbers) -> the mode or the numbers; UserError otherwise."""
    if not isinstance(text, str):
        return tuple(float(x) for x in text)
    if text in WEIGHT_MODES:
        return text
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UserError(
            f"--weights: {text!r} is neither tokens, samples, uniform nor numbers such as 0.7,0.3"
        ) from None


def input_weights(inputs: Sequence[ModelInput], spec: str | Sequence[float]) -> InputWeights:
    """The weights of `inputs` under `spec`; every problem at once in one UserError, each naming the input and the way out."""
    parsed = parse_weights(spec)
    problems: list[str] = []
    if isinstance(parsed, tuple):
        mode, raw = "explicit", parsed
        if len(raw) != len(inputs):
            raise UserError(
                f"--weights: {len(raw)} numbers for {len(inputs)} inputs; give one per input, in the order of the inputs"
            )
        for i, w in enumerate(raw):
            if not math.isfinite(w) or w < 0:
                problems.append(
                    f"--weights: the weight of {inputs[i].label(i)} is {w}; weights must be finite and not negative"
                )
    elif parsed == "uniform":
        mode, raw = parsed, tuple(1.0 for _ in inputs)
    else:
        mode = parsed
        counts = []
        for i, inp in enumerate(inputs):
            value = inp.tokens if mode == "tokens" else inp.samples
            source = inp.tokens_source if mode == "tokens" else inp.samples_source
            if value is None:
                problems.append(
                    f"--weights {mode}: {inp.label(i)} has no count of {mode} seen ({source}); "
                    f"use --weights uniform or explicit weights such as --weights {','.join(['1'] * len(inputs))}"
                )
            elif value < 0:
                problems.append(f"--weights {mode}: {inp.label(i)} says it has seen {value} {mode} ({source})")
            counts.append(float(value or 0))
        raw = tuple(counts)
    if not problems and sum(raw) <= 0:
        problems.append(
            f"--weights {mode}: every weight is zero ({', '.join(f'{w:g}' for w in raw)}); at least one input must count"
        )
    if problems:
        raise UserError(joined_problems(problems))
    try:
        total = math.fsum(raw)
        return InputWeights(mode, raw, tuple(w / total for w in raw))
    except OverflowError:  # weights near the largest float (1e308,1e308): their sum is beyond it, their ratios are not
        largest = max(raw)
        scaled = [w / largest for w in raw]
        return InputWeights(mode, raw, tuple(w / math.fsum(scaled) for w in scaled))
