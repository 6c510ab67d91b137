"""`supertune federate` as the tests run it (a process of its own), and the two embedded sites most
federation tests train."""

from __future__ import annotations

import os
import subprocess
import sys

from supertune.federation.config.default import site_corpus

# Output only: no tracker, no sample, a short evaluation; warmup off so that a few steps train.
SITE_OVERRIDES = (
    "generate.max_new_tokens=0",
    "training.report_to=[]",
    "data.max_eval_samples=16",
    "training.warmup_steps=0",
)


def federate_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """`supertune federate ARGS` with `env` over this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "supertune", "federate", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=timeout,
    )


def corpus_sites(steps_per_round: int, names: tuple[str, ...] = ("site-a", "site-b")) -> list[dict]:
    """Sites named after the embedded site corpora, each on its own (site_corpus), SITE_OVERRIDES set."""
    sites = []
    for name in names:
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", *SITE_OVERRIDES]
        sites.append({"name": name, "overrides": overrides, "steps_per_round": steps_per_round})
    return sites
