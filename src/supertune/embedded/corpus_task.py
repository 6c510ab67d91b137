"""The embedded benchmark: multiple-choice questions on the embedded corpus, as an
lm-evaluation-harness group of three tasks (YAML files and JSON-lines data) that runs offline.

Every question has four choices, so chance is 0.25. The group `supertune_corpus` (its score: the
mean over all its questions) holds 64 questions of each kind:

* `supertune_corpus_verbs`, agreement: "The foxes" sleep / hides / eats / waits: one choice agrees
  with the subject ("the dogs sleep", "the dog sleeps"), the three others do not;
* `supertune_corpus_nouns`, number: "Otto finds seven" apples / lamp / coin / hat: one choice has the
  number of the count word ("one apple", "seven apples");
* `supertune_corpus_facts`, a fact every document shares: "Ilse is a baker, so she works at the"
  bakery / forge / harbor / clinic.

Measured on the embedded default run (120 steps) over seeds 1, 2 and 3: nouns 0.88, verbs
0.27-0.42, facts 0.17-0.25 (chance: the facts need a longer training), the group 0.44-0.52; an
untrained model 0.21.
The group so stays well above chance after a short run, and the facts task shows what longer
training adds. The harness compares the model's
log-likelihood of each choice after the question: no generation, 768 short forward passes (a few
seconds on a CPU for the embedded model). Built once under cache_dir()/corpus-task-v1/ as the corpus
is; each YAML names its data file by absolute path, which is why the files are written at build
time and not shipped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import yaml

from supertune.paths import cache_dir

from .corpus import ANIMALS, FEMALE, MALE, NUMBERS, OBJECTS, PROFESSIONS, RESTING_VERBS, TAKING_VERBS, build_once

__all__ = ["CORPUS_TASK", "corpus_questions", "corpus_task_dir"]

CORPUS_TASK = "supertune_corpus"
"""The group's name, as `--tasks` and evaluation.tasks spell it."""

# Bump when the questions or the YAML change: the cache directory name carries it.
TASK_VERSION = "v1"
# Not a corpus seed: the questions reuse the corpus's vocabulary, not its documents.
QUESTIONS_SEED, PER_KIND = 7, 64


def _name(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(FEMALE + MALE)
    return name, "she" if name in FEMALE else "he"


def _question(rng: random.Random, query: str, right: str, wrong: list[str]) -> dict:
    choices = [right, *wrong]
    rng.shuffle(choices)
    return {"query": query, "choices": choices, "label": choices.index(right)}


def _verbs(rng: random.Random) -> dict:
    # "sheep" is its own plural: the subject would not say which form agrees.
    one, many = rng.choice([a for a in ANIMALS if a[0] != a[1]])
    plural = rng.random() < 0.5
    verb, *others = rng.sample(RESTING_VERBS, 4)
    form = 1 if plural else 0  # (third person singular, plural)
    return _question(rng, f"The {many if plural else one}", verb[form], [v[1 - form] for v in others])


def _nouns(rng: random.Random) -> dict:
    name, _ = _name(rng)
    n = rng.choice([1, *range(2, 10)])
    thing, *others = rng.sample(OBJECTS, 4)
    form = 0 if n == 1 else 1  # (singular, plural)
    verb = rng.choice(TAKING_VERBS)[0]
    return _question(rng, f"{name} {verb} {NUMBERS[n]}", thing[form], [o[1 - form] for o in others])


def _facts(rng: random.Random) -> dict:
    profession = rng.choice(sorted(PROFESSIONS))
    name, subject = _name(rng)
    place = PROFESSIONS[profession][0]
    wrong = rng.sample(sorted({p[0] for p in PROFESSIONS.values()} - {place}), 3)
    return _question(rng, f"{name} is a {profession}, so {subject} works at the", place, wrong)


KINDS: dict[str, Callable[[random.Random], dict]] = {"verbs": _verbs, "nouns": _nouns, "facts": _facts}


def corpus_questions() -> dict[str, list[dict]]:
    """The questions of each kind, identical on every machine (own RNG, fixed seed)."""
    rng = random.Random(QUESTIONS_SEED)
    return {kind: [make(rng) for _ in range(PER_KIND)] for kind, make in KINDS.items()}


def _task_config(name: str, data: Path) -> dict:
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{query}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def _group_config() -> dict:
    return {
        "group": CORPUS_TASK,
        "task": [f"{CORPUS_TASK}_{kind}" for kind in KINDS],
        "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": True}],
        "metadata": {"version": 1.0},
    }


def corpus_task_dir() -> Path:
    """The directory holding the group's YAML files and data (an include path for the harness), built once."""
    target = cache_dir() / f"corpus-task-{TASK_VERSION}"
    if target.is_dir():
        return target

    def write(tmp: Path) -> None:
        for kind, questions in corpus_questions().items():
            name = f"{CORPUS_TASK}_{kind}"
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
            # The YAML names the data where it will lie once published, not in the temporary directory.
            config = _task_config(name, target / f"{name}.jsonl")
            (tmp / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        (tmp / f"{CORPUS_TASK}.yaml").write_text(yaml.safe_dump(_group_config(), sort_keys=False), encoding="utf-8")

    build_once(target, write)
    return target
