"""The embedded default federation: `supertune federate` with no config runs two sites on this
machine, each on its own corpus, for three rounds, offline and in a few minutes.

The two corpora are stories made by the embedded generator from different seeds: one grammar, no
document in common (each site's validation documents are its own, too). They are written once
under the supertune cache, like the embedded corpus.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ...paths import cache_dir
from .schema import FederationConfig, SiteConfig

__all__ = ["default_federation", "site_corpus", "SITE_SEEDS"]

# (train seed, validation seed) per site; far from the embedded corpus's own seeds.
SITE_SEEDS = {"site-a": (7101, 7102), "site-b": (8201, 8202)}
TRAIN_DOCS, VALIDATION_DOCS = 800, 80
STEPS_PER_ROUND = 30


def site_corpus(name: str) -> tuple[Path, Path]:
    """(train, validation) JSON-lines files of a default site, built once."""
    from ...embedded.corpus import generate_documents, publish_dir

    target = cache_dir() / "federation-v1" / name
    train, validation = target / "train.jsonl", target / "validation.jsonl"
    if target.is_dir():
        return train, validation
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        train_seed, validation_seed = SITE_SEEDS[name]
        for path, seed, n in (
            (tmp / train.name, train_seed, TRAIN_DOCS),
            (tmp / validation.name, validation_seed, VALIDATION_DOCS),
        ):
            path.write_text(
                "".join(json.dumps({"text": t}) + "\n" for t in generate_documents(seed, n)), encoding="utf-8"
            )
        publish_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return train, validation


def default_federation() -> FederationConfig:
    """Two local sites on their own corpora, three rounds, token-weighted FedAvg from the embedded tiny Llama."""
    sites = []
    for name in SITE_SEEDS:
        train, validation = site_corpus(name)
        sites.append(SiteConfig(
            name=name,
            overrides=[f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0"],
            steps_per_round=STEPS_PER_ROUND,
        ))  # fmt: skip
    return FederationConfig(name="supertune-federation", rounds=3, sites=sites)
