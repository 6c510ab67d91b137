"""The embedded preference data: a fact of a town in the embedded corpus's world and a question about
it, each with an answer that agrees with the fact (chosen) and one that contradicts it (rejected).

The facts are those the embedded stories tell (supertune.embedded.corpus), in their words: where a
landmark lies, what a person does, where a profession works and what it makes ("Ada is a baker, so
she works at the bakery"). A prompt states one fact and asks about it; the chosen answer repeats
it, the rejected one is the same sentence with one word that contradicts it: another direction,
profession, workplace or ware. Telling them apart takes reading the fact in the prompt (a copy
across the conversation, what a model learns early), not the wording, which is the same on both
sides, nor which words are wrong, which are as often right in another pair.

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
    job = rng.choice(sorted(PROFESSIONS))
    place, _, wares = PROFESSIONS[job]
    if kind == "job":
        wrong = rng.choice(sorted(set(PROFESSIONS) - {job}))
        return f"{name} is a {job} in {town}. What does {name} do?", f"{name} is a {job}.", f"{name} is a {wrong}."
    if kind == "workplace":
        wrong = rng.choice(sorted({p for p, _, _ in PROFESSIONS.values()} - {place}))
        fact = f"{name} is a {job}, so {subject} works at the {place} of {town}."
        return f"{fact} Where does {name} work?", f"{name} works at the {place}.", f"{name} works at the {wrong}."
    wrong = rng.choice(sorted({w for _, _, w in PROFESSIONS.values()} - {wares}))
    fact = f"As a {job} in {town}, {name} makes {wares}."
    return f"{fact} What does {name} make?", f"{name} makes {wares}.", f"{name} makes {wrong}."


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
