"""training.objective: what a run's loss is, one record per objective.

`sft` is next-token prediction on the run's data as it always was. The others are preference
objectives: they read rows of a chosen and a rejected answer to one prompt (`pairs`: DPO, ORPO,
SimPO) or of one answer marked desirable or not (`unpaired`: KTO), and need a reference model or not.
The record says which knobs of training it reads; a knob changed for an objective that does not read
it is a config error, so a mistyped objective cannot silently train with the defaults.

How each loss is computed lives in supertune.train.preference.preference_losses, one function per name here
(tests/test_preference_losses.py holds the two tables to the same names). This module imports
nothing heavy: config validation and `--help` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "KNOB_DEFAULTS",
    "OBJECTIVES",
    "OBJECTIVES_BEGIN",
    "OBJECTIVES_END",
    "Objective",
    "objective_names",
    "objective_problems",
    "objectives_markdown",
]


@dataclass(frozen=True)
class Objective:
    name: str
    rows: Literal["text", "pairs", "unpaired"]
    """What a data row is: the run's documents (sft), {prompt, chosen, rejected}, or {prompt, completion, label}."""
    reference: bool
    """Whether the loss compares against a reference model (the start model, or the LoRA base)."""
    knobs: tuple[str, ...]
    """The training.* settings the loss reads."""
    summary: str


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("sft", "text", False, (), "next-token cross-entropy on the run's data (data.format, data.loss_on)"),
        Objective(
            "dpo",
            "pairs",
            True,
            ("beta", "dpo_loss"),
            "Direct Preference Optimization (Rafailov et al. 2023): the chosen answer's log-probability ratio "
            "to the reference above the rejected one's; training.dpo_loss picks sigmoid (DPO), ipo (Azar et al. 2023) or hinge (SLiC)",
        ),
        Objective(
            "orpo",
            "pairs",
            False,
            ("beta",),
            "Odds Ratio Preference Optimization (Hong et al. 2024): the chosen answer's cross-entropy plus "
            "training.beta (the paper's lambda) times the log odds ratio loss; no reference model",
        ),
        Objective(
            "simpo",
            "pairs",
            False,
            ("beta", "simpo_gamma"),
            "Simple Preference Optimization (Meng et al. 2024): length-normalised log-probabilities, chosen above "
            "rejected by the margin training.simpo_gamma, scaled by training.beta; no reference model",
        ),
        Objective(
            "kto",
            "unpaired",
            True,
            ("beta", "desirable_weight", "undesirable_weight"),
            "Kahneman-Tversky Optimization (Ethayarajh et al. 2024): each answer alone, labelled desirable or not, "
            "against the reference and a batch estimate of the KL divergence",
        ),
    )
}

KNOB_DEFAULTS: dict[str, object] = {
    "beta": 0.1,
    "dpo_loss": "sigmoid",
    "simpo_gamma": 0.5,
    "desirable_weight": 1.0,
    "undesirable_weight": 1.0,
}
"""The defaults of the preference knobs (the schema's, and TRL's), to tell a changed knob from an untouched one."""


def objective_names() -> list[str]:
    return list(OBJECTIVES)


def objective_problems(objective: str, knobs: dict[str, object]) -> list[str]:
    """One line per problem of training.objective and its knobs (`knobs`: name -> the config's value)."""
    record = OBJECTIVES.get(objective)
    if record is None:  # the schema's OneOf refuses it first; this is for callers that build configs by hand
        return [f"training.objective: {objective!r} is not an objective; use one of {', '.join(OBJECTIVES)}"]
    problems = []
    for name, value in knobs.items():
        if name not in record.knobs and value != KNOB_DEFAULTS[name]:
            readers = [o.name for o in OBJECTIVES.values() if name in o.knobs]
            problems.append(
                f"training.{name}: set to {value!r}, but training.objective={objective} does not read it "
                f"(read by {', '.join(readers)}); leave it out or choose one of those objectives"
            )
    beta = knobs.get("beta")
    if isinstance(beta, (int, float)) and beta <= 0:
        problems.append(f"training.beta: must be positive, got {beta} (DPO and KTO use about 0.1, SimPO about 2)")
    gamma = knobs.get("simpo_gamma")
    if isinstance(gamma, (int, float)) and gamma < 0:
        problems.append(f"training.simpo_gamma: must not be negative, got {gamma} (the SimPO paper uses 0.5 to 1.6)")
    for name in ("desirable_weight", "undesirable_weight"):
        value = knobs.get(name)
        if isinstance(value, (int, float)) and value <= 0:
            problems.append(f"training.{name}: must be positive, got {value}")
    return problems


OBJECTIVES_BEGIN = "<!-- objectives: generated by supertune.config.objectives; do not edit by hand -->"
OBJECTIVES_END = "<!-- end of objectives -->"


def objectives_markdown() -> str:
    """The objectives' table of docs/preference.md, from OBJECTIVES (a test keeps the page current)."""
    rows = [
        "| `training.objective` | a data row | reference model | reads | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    shapes = {
        "text": "the run's documents (`data.format`)",
        "pairs": "`{prompt, chosen, rejected}`",
        "unpaired": "`{prompt, completion, label}`",
    }
    for o in OBJECTIVES.values():
        name = f"`{o.name}`" + (" (default)" if o.name == "sft" else "")
        reads = ", ".join(f"`training.{k}`" for k in o.knobs) or "-"
        rows.append(f"| {name} | {shapes[o.rows]} | {'yes' if o.reference else 'no'} | {reads} | {o.summary} |")
    return "\n".join([OBJECTIVES_BEGIN, *rows, OBJECTIVES_END])
