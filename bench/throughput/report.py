"""Medians over rounds, the ratios the targets are stated in, and the table printed and committed."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from .arms import ArmRun

__all__ = ["Summary", "summarize", "markdown_table", "rounds_table", "ratio_lines", "to_jsonable", "TARGETS"]

# (ratio name, numerator arm, denominator arm, metric, comparison, target)
TARGETS = [
    ("a/b effective tokens/s", "a", "b", "tokens_per_second", ">=", 3.0),
    ("a/c tokens/s", "a", "c", "tokens_per_second", ">=", 1.0),
    ("a/c time to first step", "a", "c", "time_to_first_step_s", "<=", 0.5),
    ("d/a tokens/s (training.speed auto against plain)", "d", "a", "tokens_per_second", ">=", 0.95),
]

METRICS = [
    "time_to_first_step_s",
    "tokens_per_second",
    "slot_tokens_per_second",
    "padding_fraction",
    "median_step_s",
    "steady_tokens",
    "steady_time_s",
    "other_cores",
]


def _value(run: ArmRun, metric: str) -> float:
    if metric == "other_cores":
        return float("nan") if run.other_cores is None else run.other_cores
    return float(getattr(run.measurement, metric))


@dataclass
class Summary:
    medians: dict[str, dict[str, float]]
    """arm key -> metric -> median over rounds."""
    spread: dict[str, dict[str, list[float]]]
    """arm key -> metric -> [min, max] over rounds."""
    ratios: list[dict[str, Any]]


def summarize(rounds: list[dict[str, ArmRun]]) -> Summary:
    keys = list(rounds[0])
    medians: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, list[float]]] = {}
    for k in keys:
        values = {m: [_value(r[k], m) for r in rounds] for m in METRICS}
        medians[k] = {m: statistics.median(v) for m, v in values.items()}
        spread[k] = {m: [min(v), max(v)] for m, v in values.items()}
    ratios = []
    for name, num, den, metric, op, target in TARGETS:
        if num in medians and den in medians:
            value = medians[num][metric] / medians[den][metric]
            met = value >= target if op == ">=" else value <= target
            # The machine's speed drifts between rounds (on the development machine both arms ran
            # 25 % faster in the last two of five idle rounds than in the first three): the ratio of
            # the two arms within each round, and its median, cannot fall on a slow and a fast round.
            paired = statistics.median(_value(r[num], metric) / _value(r[den], metric) for r in rounds)
            ratios.append(
                {
                    "name": name,
                    "metric": metric,
                    "value": value,
                    "paired": paired,
                    "target": f"{op} {target}",
                    "met": met,
                }
            )
    return Summary(medians, spread, ratios)


def markdown_table(summary: Summary, names: dict[str, str], rounds: int) -> str:
    """The arms side by side; with several rounds each cell is the median and the table says so."""
    head = (
        "| arm | time to first step (s) | effective tok/s | all slots tok/s | padding | median step (s) | other load (cores) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    rows = []
    for k, m in summary.medians.items():
        lo, hi = summary.spread[k]["tokens_per_second"]
        t_lo, t_hi = summary.spread[k]["time_to_first_step_s"]
        ranges = rounds > 1
        rows.append(
            f"| ({k}) {names[k]} "
            f"| {m['time_to_first_step_s']:.1f}" + (f" ({t_lo:.1f}-{t_hi:.1f})" if ranges else "") + " "
            f"| {m['tokens_per_second']:,.0f}" + (f" ({lo:,.0f}-{hi:,.0f})" if ranges else "") + " "
            f"| {m['slot_tokens_per_second']:,.0f} "
            f"| {100 * m['padding_fraction']:.1f} % "
            f"| {m['median_step_s']:.2f} "
            f"| {m['other_cores']:.2f} |"
        )
    note = (
        "\nOther load: cores kept busy by other processes while the arm ran (the machine is shared; 2 cores in all).\n"
        + (f"Medians of {rounds} rounds; (min-max) in brackets.\n" if rounds > 1 else "")
    )
    return head + "\n".join(rows) + "\n" + note


def rounds_table(rounds: list[dict[str, ArmRun]], names: dict[str, str]) -> str:
    """Every arm run in the order it ran, so a disturbed round can be seen next to the others."""
    lines = [
        "| round | arm | time to first step (s) | effective tok/s | other load (cores) |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(rounds, start=1):
        for k, run in r.items():
            m = run.measurement
            other = "?" if run.other_cores is None else f"{run.other_cores:.2f}"
            lines.append(
                f"| {i} | ({k}) {names[k]} | {m.time_to_first_step_s:.1f} | {m.tokens_per_second:,.0f} | {other} |"
            )
    return "\n".join(lines) + "\n"


def ratio_lines(summary: Summary) -> list[str]:
    return [
        f"{r['name']}: {r['value']:.2f}x (target {r['target']}x: {'met' if r['met'] else 'NOT met'}); "
        f"within each round, median {r['paired']:.2f}x"
        for r in summary.ratios
    ]


def to_jsonable(summary: Summary) -> dict[str, Any]:
    return asdict(summary)
