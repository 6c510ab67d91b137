"""The job scripts of `supertune prepare --submit`, rendered by pure functions (exact-text tested).

Two jobs, both running the entry point `prepare-array`: an array with one task per part of the
store (`--part $SLURM_ARRAY_TASK_ID`), and a merge job (`--merge`) that depends on the array with afterok. A dependent job rather
than "the last task merges": the scheduler then knows that every task succeeded, no task has to
find out on a shared filesystem whether it is the last one (a race between tasks that end together),
and a failed task leaves the merge unstarted (--kill-on-invalid-dep removes it from the queue), so
the re-run only redoes the failed parts and merges. It costs one more queue wait, for a job of a
few minutes against tasks of hours.

Every value is quoted as in the training job script (`shell.quote`, `sbatch_value`, `env_value`);
the profile's modules, environment and container are used the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..clusters.schema import ClusterProfile
from ..entry import PREPARE_ARRAY, entry_words
from .script import (
    comment,
    container_words,
    directives,
    env_name,
    modules_section,
    site_options,
)  # one rule for both scripts
from .shell import Expand, env_value, join, sbatch_value, slurm_filename

__all__ = ["PrepareJob", "render_array_script", "render_merge_script"]


@dataclass(frozen=True)
class PrepareJob:
    """What both scripts read; a pure value."""

    name: str
    work: str
    """Work directory: config, plan, parts, logs/."""
    out: str
    parts: int
    cpus: int
    """Cores per task: the tokenizer's Rust threads use them all."""
    time: str
    partition: str | None
    account: str | None
    qos: str | None
    mem: str | None
    extra_args: tuple[str, ...]
    python: str


def render_array_script(job: PrepareJob, profile: ClusterProfile, tasks: Sequence[int]) -> str:
    """The array job: one task per part in `tasks` (the unfinished ones)."""
    header = _header(job, "tokenizing, one array task per part", [("array", _array_spec(tasks))], "%x-%A_%a")
    step = [
        f"# Part $SLURM_ARRAY_TASK_ID of {job.parts}; a finished part is skipped",
        join(
            [
                *container_words(profile),
                job.python,
                *entry_words(PREPARE_ARRAY, ["--part", Expand("${SLURM_ARRAY_TASK_ID}"), "--work", job.work]),
            ]
        ),
    ]
    return _script(header, job, profile, "\n".join(step))


def render_merge_script(job: PrepareJob, profile: ClusterProfile) -> str:
    """The merge job. Its dependency on the array job is given to sbatch when submitting
    (--dependency=afterok:ID), since the array's id is known only then."""
    header = _header(job, "merging the parts into the store", [("kill-on-invalid-dep", "yes")], "%x-%j")
    step = [
        f"# Shards and manifest of {comment(job.out)}, byte-identical to a single-process prepare",
        join([*container_words(profile), job.python, *entry_words(PREPARE_ARRAY, ["--merge", job.work])]),
    ]
    return _script(header, job, profile, "\n".join(step))


def _array_spec(tasks: Sequence[int]) -> str:
    """sbatch --array of ascending task ids, runs of consecutive ids written first-last ("0-7,9,12-15"),
    in one pass without a copy: `tasks` may be a range of millions."""
    if not tasks:
        raise ValueError("no array tasks")
    runs: list[str] = []
    first = last = tasks[0]
    for task in itertools.islice(tasks, 1, None):
        if task != last + 1:
            runs.append(f"{first}-{last}" if last > first else str(first))
            first = task
        last = task
    runs.append(f"{first}-{last}" if last > first else str(first))
    return ",".join(runs)


def _script(header: str, job: PrepareJob, profile: ClusterProfile, step: str) -> str:
    sections = [header, "set -euo pipefail", modules_section(profile), _environment(job, profile), step]
    return "\n\n".join(s for s in sections if s) + "\n"


def _header(job: PrepareJob, what: str, extra: list[tuple[str, str]], log_pattern: str) -> str:
    logs = slurm_filename("--out", job.work) + "/logs"
    options: list[tuple[str, object | None]] = [
        ("job-name", sbatch_value("--out", job.name)),
        *extra,
        ("nodes", 1),
        ("ntasks", 1),
        ("cpus-per-task", job.cpus),
        *site_options(job.time, job.partition, job.account, job.qos, job.mem),
        ("output", sbatch_value("--out", f"{logs}/{log_pattern}.out")),
        ("error", sbatch_value("--out", f"{logs}/{log_pattern}.err")),
        ("open-mode", "append"),
    ]
    lines = [
        "#!/bin/bash",
        f"# supertune prepare of the token store {comment(job.out)}: {what}.",
        "# Rendered by supertune prepare --submit; run that again rather than edit this file.",
    ]
    lines += directives(options)
    lines += [f"#SBATCH {sbatch_value('slurm.extra_args', arg)}" for arg in job.extra_args]
    return "\n".join(lines)


def _environment(job: PrepareJob, profile: ClusterProfile) -> str:
    lines = ["# Environment (cluster profile, then supertune's own)"]
    lines += [f"export {env_name(name)}={env_value(str(value))}" for name, value in profile.env.items()]
    lines += [
        "# prepare encodes on one thread per core of the task; a tokenizer it calls as itself uses its",
        "# Rust threads instead. Profiles switch those off for training (forked data-loader workers).",
        "export TOKENIZERS_PARALLELISM=true",
        f"export RAYON_NUM_THREADS={job.cpus}",
    ]
    return "\n".join(lines)
