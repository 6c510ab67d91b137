"""The embedded conversations: question/answer turns about the facts of a generated town, and the
chat template the embedded tokenizer renders them with (it has none of its own).

Each conversation opens with a system turn that states the facts (what each person of a town does,
where two landmarks lie) and then asks one to three questions whose answers follow
from them, or from the world facts every story shares (a baker works at the bakery), or from small
arithmetic. The answers are therefore predictable from the conversation itself: a model trained on
the answers alone learns to read the system turn, one trained on every token also spends its
capacity on the facts, which are random.

The template marks every turn with its role on a line of its own and ends it with EOS, so that a
generated answer stops at EOS; it adds no tokens to the vocabulary (the markers are ordinary
byte-level text). Generation uses only ``random.Random(seed)``, as the stories do.
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
    NUMBERS,
    PROFESSIONS,
    TOWN_HEADS,
    TOWN_TAILS,
    build_once,
)
from supertune.paths import cache_dir

__all__ = [
    "CHAT_CORPUS_VERSION",
    "EMBEDDED_CHAT_TEMPLATE",
    "ChatCorpus",
    "chat_corpus",
    "generate_conversations",
    "sample_conversation",
]

CHAT_CORPUS_VERSION = "v1"
TRAIN_SEED, TRAIN_CONVERSATIONS = 11, 4000
VALIDATION_SEED, VALIDATION_CONVERSATIONS = 12, 200
SAMPLE_SEED = 13

# Each turn: "<|role|>" on its own line, the content, EOS, a line break; the generation prompt is the
# assistant's marker line. The answer begins after a line break, so its first token is never merged
# with the marker by the byte-level pre-tokenizer.
EMBEDDED_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _town(rng: random.Random) -> tuple[str, list[tuple[str, str, str]], dict[str, str]]:
    town = rng.choice(TOWN_HEADS) + rng.choice(TOWN_TAILS)
    names = rng.sample(FEMALE + MALE, rng.randint(2, 3))
    people = [
        (n, "she" if n in FEMALE else "he", p) for n, p in zip(names, rng.sample(sorted(PROFESSIONS), len(names)))
    ]
    where = {lm: rng.choice(DIRECTIONS) for lm in rng.sample(LANDMARKS, 2)}
    return town, people, where


def _question(
    rng: random.Random, town: str, people: list[tuple[str, str, str]], where: dict[str, str]
) -> tuple[str, str]:
    kind = rng.choice(("where", "job", "workplace", "make", "sum"))
    name, subject, job = rng.choice(people)
    if kind == "where":
        lm = rng.choice(sorted(where))
        return f"Where is the {lm}?", f"The {lm} is {where[lm]} of {town}."
    if kind == "job":
        return f"What does {name} do?", f"{name} is a {job}."
    if kind == "workplace":
        return f"Where does {name} work?", f"{name} is a {job}, so {subject} works at the {PROFESSIONS[job][0]}."
    if kind == "make":
        return f"What does {name} make?", f"{name} makes {PROFESSIONS[job][2]}."
    a, b = rng.randint(0, 10), rng.randint(0, 10)
    return (
        f"What is {NUMBERS[a]} plus {NUMBERS[b]}?",
        f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}.",
    )


def _conversation(rng: random.Random) -> list[dict[str, str]]:
    town, people, where = _town(rng)
    facts = [f"{n} is a {job}." for n, _, job in people]
    facts += [f"The {lm} is {d} of {town}." for lm, d in where.items()]
    messages = [{"role": "system", "content": " ".join(facts)}]
    for _ in range(rng.randint(1, 3)):
        question, answer = _question(rng, town, people, where)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


def generate_conversations(seed: int, n: int) -> list[list[dict[str, str]]]:
    """``n`` conversations, identical for identical ``seed``."""
    rng = random.Random(seed)
    return [_conversation(rng) for _ in range(n)]


def sample_conversation() -> list[dict[str, str]]:
    """A conversation of neither split, up to its first question: the prompt of a chat run's sample."""
    return generate_conversations(SAMPLE_SEED, 1)[0][:2]


@dataclass(frozen=True)
class ChatCorpus:
    """Paths of the embedded conversations' JSON-lines splits (one ``{"messages": [...]}`` per line)."""

    train: Path
    validation: Path


def chat_corpus() -> ChatCorpus:
    """Build the embedded conversations under ``cache_dir()/chat-corpus-v1/`` once, then reuse them
    (published by an atomic rename, as the stories are)."""
    target = cache_dir() / f"chat-corpus-{CHAT_CORPUS_VERSION}"
    result = ChatCorpus(train=target / "train.jsonl", validation=target / "validation.jsonl")
    if target.is_dir():
        return result

    def write(tmp: Path) -> None:
        for path, (seed, n) in (
            (tmp / "train.jsonl", (TRAIN_SEED, TRAIN_CONVERSATIONS)),
            (tmp / "validation.jsonl", (VALIDATION_SEED, VALIDATION_CONVERSATIONS)),
        ):
            with path.open("w", encoding="utf-8") as f:
                for messages in generate_conversations(seed, n):
                    f.write(json.dumps({"messages": messages}) + "\n")

    build_once(target, write)
    return result
