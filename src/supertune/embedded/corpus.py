"""The embedded corpus: synthetic English-like stories that a tiny model can learn from offline.

Each document is set in one town with a small cast of named characters and a few landmarks.
The text has structure at several distances, so that loss keeps falling as a model gets better:

* local grammar: fixed phrase shapes, subject/verb agreement ("the dog sleeps", "the dogs
  sleep", "Mara and Otto walk"), number agreement ("one apple", "three apples");
* document memory: the town, the characters, their pronouns and professions and where each
  landmark lies ("the mill is north of the town") are chosen once per document and then
  repeated consistently, so earlier text predicts later text;
* world facts shared by all documents: a baker works at the bakery and makes loaves;
* small arithmetic with number words ("seven plus two is nine").

Generation uses only ``random.Random(seed)``, so the same seed gives the same bytes on every
machine. Across Python versions ``random`` only promises a stable ``random()`` stream, not
``choice``/``sample``; a change there would alter the text but not its distribution, and each
cache is built once by one interpreter.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supertune.paths import cache_dir

__all__ = ["DefaultCorpus", "default_corpus", "generate_documents"]

# Bump when the generator changes: the cache directory name carries it, so an old cache is
# never mistaken for the new corpus (and a tokenizer keyed on it is retrained).
CORPUS_VERSION = "v1"

# Sized so that the train split is about 3 MB and the validation split about 150 KB; the
# seeds differ so the splits share a distribution but no documents.
TRAIN_SEED, TRAIN_DOCS = 1, 2500
VALIDATION_SEED, VALIDATION_DOCS = 2, 125

# Document length in words, drawn uniformly; varied lengths make sequence packing matter.
MIN_WORDS, MAX_WORDS = 40, 400

FEMALE = (
    "Ada Alma Clara Edith Elsie Fern Greta Hazel Hester Ilse Iris Josie June Lena Mabel Mara "
    "Nora Rosa Tilda Wren Vera Opal Ruth Sonja"
).split()
MALE = (
    "Abel Bram Cyrus Emil Ezra Felix Gideon Henrik Hugo Ivo Jasper Lars Milo Nils Olin Otto "
    "Piet Rufus Silas Tomas Viktor Anton Bruno Caspar"
).split()
TOWN_HEADS = ("Ash Bram Cold Elm Fen Gold Hart Iron Kings Lark Mill North Oak Pen Red Stone Thorn West Wil Yar").split()
TOWN_TAILS = "ford wick by ham mere ton stead bury field holm".split()
LANDMARKS = (
    "river mill forest bridge market tower lake hill chapel harbor orchard well inn school "
    "farm castle meadow quarry garden library bakery station pond"
).split()
DIRECTIONS = ("north", "south", "east", "west")
# profession -> (workplace, product singular, product plural): facts shared by every document.
PROFESSIONS = {
    "baker": ("bakery", "loaf", "loaves"),
    "smith": ("forge", "nail", "nails"),
    "farmer": ("farm", "turnip", "turnips"),
    "weaver": ("workshop", "blanket", "blankets"),
    "potter": ("workshop", "jar", "jars"),
    "sailor": ("harbor", "rope", "ropes"),
    "teacher": ("school", "lesson", "lessons"),
    "miller": ("mill", "sack", "sacks"),
    "carpenter": ("workshop", "chair", "chairs"),
    "fisher": ("river", "net", "nets"),
    "doctor": ("clinic", "remedy", "remedies"),
    "gardener": ("garden", "rose", "roses"),
    "painter": ("studio", "picture", "pictures"),
    "tailor": ("shop", "coat", "coats"),
    "shepherd": ("meadow", "fence", "fences"),
    "librarian": ("library", "catalog", "catalogs"),
}
OBJECTS = (
    ("apple", "apples"),
    ("basket", "baskets"),
    ("lamp", "lamps"),
    ("book", "books"),
    ("letter", "letters"),
    ("coin", "coins"),
    ("candle", "candles"),
    ("cup", "cups"),
    ("key", "keys"),
    ("knife", "knives"),
    ("hat", "hats"),
    ("pear", "pears"),
    ("plum", "plums"),
    ("egg", "eggs"),
    ("shell", "shells"),
    ("stone", "stones"),
    ("map", "maps"),
    ("bell", "bells"),
    ("brush", "brushes"),
    ("box", "boxes"),
    ("glass", "glasses"),
    ("feather", "feathers"),
    ("ribbon", "ribbons"),
    ("spoon", "spoons"),
)
ANIMALS = (
    ("dog", "dogs"),
    ("cat", "cats"),
    ("horse", "horses"),
    ("goose", "geese"),
    ("sheep", "sheep"),
    ("fox", "foxes"),
    ("crow", "crows"),
    ("owl", "owls"),
    ("goat", "goats"),
    ("cow", "cows"),
    ("mouse", "mice"),
    ("duck", "ducks"),
    ("hen", "hens"),
    ("rabbit", "rabbits"),
)
# (third person singular, plural/base form)
RESTING_VERBS = (
    ("sleeps", "sleep"),
    ("waits", "wait"),
    ("rests", "rest"),
    ("plays", "play"),
    ("hides", "hide"),
    ("sits", "sit"),
    ("eats", "eat"),
    ("wanders", "wander"),
)
TAKING_VERBS = (
    ("buys", "buy"),
    ("finds", "find"),
    ("carries", "carry"),
    ("sells", "sell"),
    ("counts", "count"),
    ("cleans", "clean"),
    ("mends", "mend"),
    ("paints", "paint"),
)
PREPOSITIONS = ("near", "behind", "beside", "under", "inside", "past")
ADJECTIVES = "old new small large red blue green heavy broken shiny wooden little".split()
MOODS = "quiet busy long short strange happy slow lucky".split()
WEATHER = "cold warm windy grey wet bright foggy calm".split()
TIMES = (
    "In the morning",
    "At noon",
    "In the afternoon",
    "In the evening",
    "At night",
    "The next day",
    "Later",
    "Soon after",
    "On Monday",
    "On Friday",
    "After lunch",
)
GREETINGS = ("Good morning", "Hello", "Good evening", "Welcome back")
NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()


@dataclass(frozen=True)
class _Person:
    name: str
    subject: str  # "she" / "he"
    possessive: str  # "her" / "his"
    profession: str


class _Story:
    """One document's fixed world (town, cast, map) and the sentence makers that use it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.town = rng.choice(TOWN_HEADS) + rng.choice(TOWN_TAILS)
        names = rng.sample(FEMALE + MALE, rng.randint(2, 4))  # at least two: pairs and dialogue
        professions = rng.sample(sorted(PROFESSIONS), len(names))
        self.cast = [
            _Person(n, *(("she", "her") if n in FEMALE else ("he", "his")), p) for n, p in zip(names, professions)
        ]
        landmarks = rng.sample(LANDMARKS, rng.randint(3, 5))
        self.where = {lm: rng.choice(DIRECTIONS) for lm in landmarks}
        self.landmarks = landmarks
        self.last: _Person = self.cast[0]
        self.continuing = False  # True while the current sentence is about ``last`` again

    # -- helpers ---------------------------------------------------------------------------

    def person(self) -> _Person:
        # Often stay with the one just mentioned, so that a pronoun has a clear referent.
        self.continuing = self.rng.random() < 0.4
        if not self.continuing:
            self.last = self.rng.choice(self.cast)
        return self.last

    def name_or_pronoun(self, p: _Person) -> str:
        return p.subject.capitalize() if self.continuing and p is self.last else p.name

    def count_of(self, thing: tuple[str, str], low: int = 1, high: int = 12) -> str:
        n = self.rng.randint(low, high)
        return f"{NUMBERS[n]} {thing[0] if n == 1 else thing[1]}"

    # -- sentence makers: each returns one or more sentences ------------------------------

    def intro(self) -> list[str]:
        r = self.rng
        out = [
            r.choice(
                (
                    f"This is a story about {self.town}.",
                    f"{self.town} is a small town.",
                    f"Once there was a town called {self.town}.",
                )
            )
        ]
        for p in self.cast:
            out.append(f"{p.name} is a {p.profession} who lives in {self.town}.")
        for lm in self.landmarks:
            out.append(f"The {lm} is {self.where[lm]} of the town.")
        return out

    def move(self) -> list[str]:
        r = self.rng
        lm = r.choice(self.landmarks)
        if r.random() < 0.3:
            a, b = r.sample(self.cast, 2)
            return [f"{r.choice(TIMES)}, {a.name} and {b.name} walk {self.where[lm]} to the {lm}."]
        p = self.person()
        return [f"{r.choice(TIMES)}, {p.name} walks {self.where[lm]} to the {lm}."]

    def fact(self) -> list[str]:
        r = self.rng
        lm = r.choice(self.landmarks)
        d = self.where[lm]
        return [
            r.choice(
                (
                    f"The {lm} is {d} of the town.",
                    f"Where is the {lm}? The {lm} is {d} of the town.",
                    f"{self.town} has a {lm} to the {d}.",
                    f"Everyone in {self.town} knows that the {lm} is {d} of the town.",
                )
            )
        ]

    def work(self) -> list[str]:
        r = self.rng
        p = self.person()
        place, one, many = PROFESSIONS[p.profession]
        who = self.name_or_pronoun(p)
        return [
            r.choice(
                (
                    f"{p.name} is a {p.profession}, so {p.subject} works at the {place}.",
                    f"{who} goes to the {place} and makes {self.count_of((one, many), 2)}.",
                    f"As a {p.profession}, {p.name} makes {self.count_of((one, many))} every day.",
                    f"The {p.profession} {p.name} opens the {place} early.",
                    f"{who} loves {p.possessive} work at the {place}.",
                )
            )
        ]

    def take(self) -> list[str]:
        r = self.rng
        verb = r.choice(TAKING_VERBS)
        thing = r.choice(OBJECTS)
        adj = r.choice(ADJECTIVES) + " " if r.random() < 0.3 else ""
        lm = r.choice(self.landmarks)
        if r.random() < 0.25:
            a, b = r.sample(self.cast, 2)
            return [f"{a.name} and {b.name} {verb[1]} {adj}{thing[1]} at the {lm}."]
        p = self.person()
        n = r.randint(1, 9)
        what = f"{NUMBERS[n]} {adj}{thing[0] if n == 1 else thing[1]}"
        return [f"{self.name_or_pronoun(p)} {verb[0]} {what} at the {lm}."]

    def there(self) -> list[str]:
        r = self.rng
        thing = r.choice(OBJECTS + ANIMALS)
        n = r.randint(1, 9)
        if n == 1:
            return [f"There is one {thing[0]} {r.choice(PREPOSITIONS)} the {r.choice(self.landmarks)}."]
        return [f"There are {NUMBERS[n]} {thing[1]} {r.choice(PREPOSITIONS)} the {r.choice(self.landmarks)}."]

    def animals(self) -> list[str]:
        r = self.rng
        animal = r.choice(ANIMALS)
        verb = r.choice(RESTING_VERBS)
        place = f"{r.choice(PREPOSITIONS)} the {r.choice(self.landmarks)}"
        if r.random() < 0.5:
            return [f"The {animal[0]} {verb[0]} {place}."]
        return [f"The {animal[1]} {verb[1]} {place}."]

    def arithmetic(self) -> list[str]:
        r = self.rng
        a, b = r.randint(0, 10), r.randint(0, 10)
        if r.random() < 0.5:
            p = self.person()
            thing = r.choice(OBJECTS)
            total = f"{NUMBERS[a + b]} {thing[0] if a + b == 1 else thing[1]}"
            return [
                f"{p.name} has {NUMBERS[a]} {thing[0] if a == 1 else thing[1]}.",
                f"{p.subject.capitalize()} finds {NUMBERS[b]} more, so now {p.subject} has {total}.",
            ]
        if r.random() < 0.5:
            return [f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}."]
        hi, lo = max(a, b), min(a, b)
        return [f"{NUMBERS[hi].capitalize()} minus {NUMBERS[lo]} is {NUMBERS[hi - lo]}."]

    def dialogue(self) -> list[str]:
        r = self.rng
        a, b = r.sample(self.cast, 2)
        lm = r.choice(self.landmarks)
        self.last = b
        return [
            f'"{r.choice(GREETINGS)}, {b.name}," says {a.name}. "Where are you going?"',
            f'"I am going to the {lm}," says {b.name}. "It is {self.where[lm]} of the town."',
        ]

    def scene(self) -> list[str]:
        r = self.rng
        return [
            r.choice(
                (
                    f"It is a {r.choice(MOODS)} day in {self.town}.",
                    f"The weather in {self.town} is {r.choice(WEATHER)}.",
                    f"{r.choice(TIMES)}, the town is {r.choice(MOODS)} and {r.choice(WEATHER)}.",
                )
            )
        ]

    def ending(self) -> str:
        r = self.rng
        p = r.choice(self.cast)
        return r.choice(
            (
                "The end.",
                f"And so the day ends in {self.town}.",
                f"{p.name} goes home, and {p.subject} sleeps well.",
            )
        )


# Relative frequencies of the sentence makers; the body is a random walk over them.
_MAKERS = (
    (_Story.move, 4),
    (_Story.fact, 3),
    (_Story.work, 3),
    (_Story.take, 4),
    (_Story.there, 2),
    (_Story.animals, 3),
    (_Story.arithmetic, 2),
    (_Story.dialogue, 2),
    (_Story.scene, 1),
)
_MAKER_FUNCS = [m for m, _ in _MAKERS]
_MAKER_WEIGHTS = [w for _, w in _MAKERS]


def _document(rng: random.Random) -> str:
    story = _Story(rng)
    target = rng.randint(MIN_WORDS, MAX_WORDS)
    sentences = story.intro()
    words = sum(s.count(" ") + 1 for s in sentences)
    while words < target:
        maker = rng.choices(_MAKER_FUNCS, _MAKER_WEIGHTS)[0]
        for s in maker(story):
            sentences.append(s)
            words += s.count(" ") + 1
    sentences.append(story.ending())
    return " ".join(sentences)


def generate_documents(seed: int, n_docs: int) -> list[str]:
    """``n_docs`` synthetic stories, identical for identical ``seed`` (own RNG, no global state)."""
    rng = random.Random(seed)
    return [_document(rng) for _ in range(n_docs)]


@dataclass(frozen=True)
class DefaultCorpus:
    """Paths of the embedded corpus's JSON-lines splits (one ``{"text": ...}`` per line)."""

    train: Path
    validation: Path


def _write_jsonl(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


def default_corpus() -> DefaultCorpus:
    """Build the embedded corpus under ``cache_dir()/corpus-v1/`` once, then reuse it.

    Safe when several processes (e.g. the ranks of one torchrun job) call it at once: each
    writes a private temporary directory next to the target and renames it into place; the
    rename is atomic, so the target is either absent or complete. A loser of the race throws
    its copy away (generation costs well under a second, so duplicate work is cheap).
    """
    target = cache_dir() / f"corpus-{CORPUS_VERSION}"
    result = DefaultCorpus(train=target / "train.jsonl", validation=target / "validation.jsonl")
    if target.is_dir():
        return result

    def write(tmp: Path) -> None:
        _write_jsonl(tmp / "train.jsonl", generate_documents(TRAIN_SEED, TRAIN_DOCS))
        _write_jsonl(tmp / "validation.jsonl", generate_documents(VALIDATION_SEED, VALIDATION_DOCS))

    build_once(target, write)
    return result


def build_once(target: Path, write: Callable[[Path], None]) -> None:
    """Make the cache directory `target` by `write` into a private temporary directory beside it,
    then publish it (publish_dir); a temporary directory left by a failure is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        publish_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, target: Path) -> None:
    """Atomically move the finished directory ``tmp`` to ``target`` unless another process won.

    ``os.rename`` onto an existing non-empty directory fails (ENOTEMPTY/EEXIST on POSIX,
    FileExistsError on Windows); that failure means someone else already published a
    complete copy, which we keep. Any other failure is re-raised.
    """
    # mkdtemp creates the directory private (0700); the cache should read like any other.
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
