"""The embedded preference data: questions whose answers the embedded corpus's shared facts settle,
each with an answer that agrees with those facts (chosen) and one that contradicts them (rejected).

Every embedded story shares the same facts of its world (supertune.embedded.corpus): each
profession works at its own place and makes its own wares ("Ada is a baker, so she works at the
bakery", "As a baker, Ada makes loaves"), and sums are sums. A question names a person of the
embedded names and a profession, or two numbers; the chosen answer states the fact in the stories'
words, the rejected one the same sentence with another profession's place or wares, or a wrong
sum. Telling them apart takes the corpus's facts, not the wording, which is the same on both sides.

Written in TRL's conversational formats: pairs as {"prompt": [user turn], "chosen": [answer turn],
"rejected": [answer turn]}; the unpaired rows of KTO as {"prompt", "completion", "label"}, each
prompt once, with its chosen answer (label true) or its rejected one (false), drawn half and half.
Generation uses only ``random.Random(seed)``, as the stories do.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from supertune.embedded.corpus import (
    DIRECTIONS,
    FEMALE,
    LANDMARKS,
    MALE,
    PROFESSIONS,
    TOWN_HEADS,
    TOWN_TAILS,
    build_once,
)
from supertune.paths import cache_dir

__all__ = ["PREFERENCE_VERSION", "PreferenceCorpus", "generate_pairs", "preference_corpus"]

PREFERENCE_VERSION = "v1"
TRAIN_SEED, TRAIN_PAIRS = 21, 2000
VALIDATION_SEED, VALIDATION_PAIRS = 22, 200

Turn = dict[str, str]


def _question(rng: random.Random) -> tuple[str, str, str]:
    """(a fact of a town and a question about it, the answer that agrees with the fact, one that contradicts it)."""
    kind = rng.choice(("where", "job", "workplace", "wares"))
    town = rng.choice(TOWN_HEADS) + rng.choice(TOWN_TAILS)
    if kind == "where":
        landmark, way = rng.choice(LANDMARKS), rng.choice(DIRECTIONS)
        wrong = rng.choice([d for d in DIRECTIONS if d != way])
        said = f"The {landmark} is {{}} of {town}."
        return f"{said.format(way)} Where is the {landmark}?", said.format(way), said.format(wrong)
    name = rng.choice(FEMALE + MALE)
    subject = "she" if name in FEMALE else "he"
    job, other = rng.sample(sorted(PROFESSIONS), 2)
    fact = f"{name} is a {job} in {town}."
    if kind == "job":
        return f"{fact} What does {name} do?", f"{name} is a {job}.", f"{name} is a {other}."
    if kind == "workplace":
        said = "{name} is a {job}, so {subject} works at the {place}."
        return (
            f"{fact} Where does {name} work?",
            said.format(name=name, job=job, subject=subject, place=PROFESSIONS[job][0]),
            said.format(name=name, job=other, subject=subject, place=PROFESSIONS[other][0]),
        )
    said = "As a {job}, {name} makes {wares}."
    return (
        f"{fact} What does {name} make?",
        said.format(job=job, name=name, wares=PROFESSIONS[job][2]),
        said.format(job=other, name=name, wares=PROFESSIONS[other][2]),
    )


def _pair(rng: random.Random) -> dict[str, list[Turn]]:
    question, chosen, rejected = _question(rng)
    return {
        "prompt": [{"role": "user", "content": question}],
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
