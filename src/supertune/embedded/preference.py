"""The embedded preference data: questions about a generated town, each with an answer that agrees
with the town's facts (chosen) and one that contradicts them (rejected).

The towns, their facts and the questions are the embedded conversations' (supertune.embedded.chat),
worded the same: a system turn states what each person does and where two landmarks lie, a user
turn asks one question. The rejected answer gets one fact wrong: a direction the system turn does
not give the landmark, a profession no one of the town has (with its workplace or its wares), or a
wrong sum. Telling them apart therefore takes reading the system turn, as answering does.

Written in TRL's conversational formats: pairs as {"prompt": [turns], "chosen": [answer turn],
"rejected": [answer turn]}; the unpaired rows of KTO as {"prompt", "completion", "label"}, each
prompt once, with its chosen answer (label true) or its rejected one (false), drawn half and half.
Generation uses only ``random.Random(seed)``, as the stories do.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from supertune.embedded.chat import town_facts
from supertune.embedded.corpus import DIRECTIONS, NUMBERS, PROFESSIONS, build_once
from supertune.paths import cache_dir

__all__ = ["PREFERENCE_VERSION", "PreferenceCorpus", "generate_pairs", "preference_corpus"]

PREFERENCE_VERSION = "v1"
TRAIN_SEED, TRAIN_PAIRS = 21, 3000
VALIDATION_SEED, VALIDATION_PAIRS = 22, 200

Turn = dict[str, str]


def _answers(
    rng: random.Random, town: str, people: list[tuple[str, str, str]], where: dict[str, str]
) -> tuple[str, str, str]:
    """(question, the answer the facts give, an answer that contradicts them)."""
    kind = rng.choice(("where", "job", "workplace", "make", "sum"))
    name, subject, job = rng.choice(people)
    other = rng.choice(sorted(set(PROFESSIONS) - {j for _, _, j in people}))
    if kind == "where":
        lm = rng.choice(sorted(where))
        wrong = rng.choice([d for d in DIRECTIONS if d != where[lm]])
        return f"Where is the {lm}?", f"The {lm} is {where[lm]} of {town}.", f"The {lm} is {wrong} of {town}."
    if kind == "job":
        return f"What does {name} do?", f"{name} is a {job}.", f"{name} is a {other}."
    if kind == "workplace":
        said = "{name} is a {job}, so {subject} works at the {place}."
        return (
            f"Where does {name} work?",
            said.format(name=name, job=job, subject=subject, place=PROFESSIONS[job][0]),
            said.format(name=name, job=other, subject=subject, place=PROFESSIONS[other][0]),
        )
    if kind == "make":
        return (
            f"What does {name} make?",
            f"{name} makes {PROFESSIONS[job][2]}.",
            f"{name} makes {PROFESSIONS[other][2]}.",
        )
    a, b = rng.randint(0, 10), rng.randint(0, 10)
    wrong = rng.choice([n for n in range(max(0, a + b - 3), min(20, a + b + 3) + 1) if n != a + b])
    said = f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is "
    return f"What is {NUMBERS[a]} plus {NUMBERS[b]}?", said + f"{NUMBERS[a + b]}.", said + f"{NUMBERS[wrong]}."


def _pair(rng: random.Random) -> dict[str, list[Turn]]:
    town, people, where = town_facts(rng)
    facts = [f"{n} is a {job}." for n, _, job in people]
    facts += [f"The {lm} is {d} of {town}." for lm, d in where.items()]
    question, chosen, rejected = _answers(rng, town, people, where)
    return {
        "prompt": [{"role": "system", "content": " ".join(facts)}, {"role": "user", "content": question}],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def generate_pairs(seed: int, n: int) -> list[dict[str, list[Turn]]]:
    """``n`` preference pairs, identical for identical ``seed``."""
    rng = random.Random(seed)
    return [_pair(rng) for _ in range(n)]


def _unpaired(pairs: list[dict[str, list[Turn]]], seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for pair in pairs:
        good = rng.random() < 0.5
        rows.append({"prompt": pair["prompt"], "completion": pair["chosen" if good else "rejected"], "label": good})
    return rows


@dataclass(frozen=True)
class PreferenceCorpus:
    """Paths of the embedded preference splits (JSON lines): pairs, and the unpaired rows of KTO."""

    pairs_train: Path
    pairs_validation: Path
    unpaired_train: Path
    unpaired_validation: Path

    def splits(self, unpaired: bool) -> tuple[Path, Path]:
        """(train, validation) of the pairs, or of the unpaired rows."""
        if unpaired:
            return self.unpaired_train, self.unpaired_validation
        return self.pairs_train, self.pairs_validation


def preference_corpus() -> PreferenceCorpus:
    """Build the embedded preference rows under ``cache_dir()/preference-v1/`` once, then reuse them
    (published by an atomic rename, as the stories are)."""
    target = cache_dir() / f"preference-{PREFERENCE_VERSION}"
    names = ("pairs-train", "pairs-validation", "unpaired-train", "unpaired-validation")
    result = PreferenceCorpus(*(target / f"{name}.jsonl" for name in names))
    if target.is_dir():
        return result

    def write(tmp: Path) -> None:
        for split, (seed, n) in (
            ("train", (TRAIN_SEED, TRAIN_PAIRS)),
            ("validation", (VALIDATION_SEED, VALIDATION_PAIRS)),
        ):
            pairs = generate_pairs(seed, n)
            for kind, rows in (("pairs", pairs), ("unpaired", _unpaired(pairs, seed))):
                with (tmp / f"{kind}-{split}.jsonl").open("w", encoding="utf-8") as f:
                    for row in rows:
                        f.write(json.dumps(row) + "\n")

    build_once(target, write)
    return result
