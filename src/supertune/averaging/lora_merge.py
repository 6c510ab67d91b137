"""`--merge-first`: average LoRA adapters as the models they make with their base, not as tensors.

An adapter changes a linear layer's weight W (out x in) to W + s * B @ A, with A (r x in),
B (out x r) and s = lora_alpha / r (lora_alpha / sqrt(r) with rsLoRA). The weighted average of
the merged models is

    sum_i w_i (W + s B_i A_i) = W + s * sum_i w_i B_i A_i        (the w_i sum to 1)

which is not W + s * (sum_i w_i B_i)(sum_i w_i A_i), what averaging the adapter tensors gives.
The sum is computed a slice of rows at a time as one product, [w_1 s B_1 | ... | w_n s B_n][rows] @
[A_1; ...; A_n]: n * r multiply-adds per output weight (64 for 4 inputs of rank 16, against 4 to
average full weights), on top of reading the base once. The output is a full model in the base's
layout (its config, its tensors), as large as the base.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..weight_files.dtypes import widen_into
from .inputs import ADAPTER_CONFIG, ModelInput

__all__ = ["MergePlan", "merge_plan"]

_LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")


@dataclass
class _Target:
    pairs: list[tuple[int, str, str]]
    """(input index, A tensor name, B tensor name)."""


class MergePlan:
    """Which base tensors the adapters change, and the low-rank sum for a slice of rows of each."""

    def __init__(
        self,
        base: ModelInput,
        inputs: Sequence[ModelInput],
        scale: float,
        transposed: bool,
        targets: dict[str, _Target],
    ) -> None:
        self.base = base
        self.inputs = inputs
        self.scale = scale
        self.transposed = transposed
        """fan_in_fan_out: the base stores W as (in x out) (GPT-2's Conv1D), so rows of W^T are changed."""
        self.targets = targets
        self._factors: tuple[str, np.ndarray, np.ndarray] | None = None

    def changes(self, name: str) -> bool:
        return name in self.targets

    def add_rows(
        self, name: str, row_start: int, row_stop: int, acc: np.ndarray, weights: Sequence[float], tmp: np.ndarray
    ) -> None:
        """acc (the base's rows [row_start, row_stop), flat) += s * sum_i w_i (B_i A_i)[rows]."""
        left, right = self._stacked(name, weights)
        rows = acc.reshape(row_stop - row_start, right.shape[1])
        out = tmp[: rows.size].reshape(rows.shape)
        np.matmul(left[row_start:row_stop], right, out=out)
        rows += out

    def _stacked(self, name: str, weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """[w_1 s B_1 | ... ] and [A_1; ...] for one target tensor (kept while its rows are computed)."""
        if self._factors is not None and self._factors[0] == name:
            return self._factors[1], self._factors[2]
        bs, as_ = [], []
        for i, a_name, b_name in self.targets[name].pairs:
            files = self.inputs[i].weights
            a, b = (self._read(files, n) for n in (a_name, b_name))
            bs.append(b * (weights[i] * self.scale))
            as_.append(a)
        left, right = np.concatenate(bs, axis=1), np.concatenate(as_, axis=0)
        if self.transposed:
            left, right = np.ascontiguousarray(right.T), np.ascontiguousarray(left.T)
        self._factors = (name, left, right)
        return left, right

    @staticmethod
    def _read(files, name: str) -> np.ndarray:
        entry = files.entry(name)
        out = np.empty(entry.numel, dtype=np.float32)
        widen_into(files.rows(name, 0, entry.numel), entry.dtype, out)
        return out.reshape(entry.shape)


def merge_plan(base: ModelInput, inputs: Sequence[ModelInput]) -> tuple[MergePlan | None, list[str]]:
    """The plan, or the problems that keep --merge-first from merging these adapters into this base."""
    problems: list[str] = []
    if base.adapter:
        return None, [f"--base {base.arg}: holds LoRA adapters; give the full base model the adapters were trained on"]
    config = inputs[0].json_file(ADAPTER_CONFIG) or {}
    for key, bad in (("use_dora", True), ("lora_bias", True)):
        if config.get(key) == bad:
            problems.append(
                f"--merge-first: the adapters use {key}; merge them with peft's merge_and_unload, or average them without --merge-first"
            )
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save"):
        if config.get(key):
            problems.append(
                f"--merge-first: the adapters set {key}; merge them with peft's merge_and_unload, or average them without --merge-first"
            )
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(
            f"--merge-first: the adapters are {config.get('peft_type')}, not LoRA; average them without --merge-first"
        )
    r = config.get("r")
    alpha = config.get("lora_alpha", r)
    if not isinstance(r, int) or r <= 0 or not isinstance(alpha, (int, float)):
        problems.append(f"--merge-first: {ADAPTER_CONFIG} of {inputs[0].label(0)} has no usable r and lora_alpha")
    if problems:
        return None, problems
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    transposed = bool(config.get("fan_in_fan_out"))
    targets: dict[str, _Target] = {}
    base_tensors = base.weights.where
    for i, inp in enumerate(inputs):
        if problems:
            break  # the first input that does not fit says what is wrong; the others would repeat it
        halves: dict[str, dict[str, str]] = {}
        for name in inp.weights.where:
            m = _LORA_KEY.match(name)
            if m is None:
                problems.append(
                    f"--merge-first: {inp.label(i)} has tensor {name}, which is not a LoRA A or B of a linear layer; average without --merge-first"
                )
                break
            halves.setdefault(m["module"] + ".weight", {})[m["which"]] = name
        for target, ab in sorted(halves.items()):
            if set(ab) != {"A", "B"} or target not in base_tensors:
                why = (
                    "has only one of lora_A and lora_B"
                    if set(ab) != {"A", "B"}
                    else f"changes {target}, which the base does not have"
                )
                problems.append(
                    f"--merge-first: {inp.label(i)} {why}; give the base these adapters were trained on (--base)"
                )
                break
            a, b, w = inp.weights.entry(ab["A"]), inp.weights.entry(ab["B"]), base_tensors[target][1]
            out_f, in_f = (-1, -1) if len(w.shape) != 2 else (w.shape[::-1] if transposed else w.shape)
            if (
                len(a.shape) != 2
                or len(b.shape) != 2
                or a.shape[1] != in_f
                or b.shape[0] != out_f
                or a.shape[0] != b.shape[1]
            ):
                problems.append(
                    f"--merge-first: {inp.label(i)}: {ab['A']} {list(a.shape)} and {ab['B']} {list(b.shape)} do not fit base tensor {target} {list(w.shape)}; "
                    "give the base these adapters were trained on (--base)"
                )
                break
            targets.setdefault(target, _Target([])).pairs.append((i, ab["A"], ab["B"]))
    if problems:
        return None, problems
    return MergePlan(base, inputs, scale, transposed, targets), []
