"""What a SLURM job script can hold: each rule written once, used by run-config validation, cluster
profile validation and the job-script renderer alike.

Every function returns None for a sound value, else the problem and its fix (without the key, which
the caller names). Nothing here imports more than `re`. Patterns are matched whole (`fullmatch`): a
`$` would also match before a final line break, which the job script header cannot hold.
"""

from __future__ import annotations

import re

__all__ = [
    "slurm_name_problem",
    "memory_problem",
    "time_problem",
    "time_seconds",
    "sbatch_option_problem",
    "env_name_problem",
    "one_line_problem",
]

# What Slurm accepts as partition, account and QOS names (a partition may also be a list: a,b).
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.,:+@-]+")
# --mem: a number with an optional unit (K, M, G, T); Slurm's default unit is M.
_MEMORY = re.compile(r"[0-9]+[KMGT]?")
# --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"(\d+-)?\d{1,3}(:\d{2}){0,2}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def slurm_name_problem(value: str) -> str | None:
    """A partition, account or QOS name."""
    if _SLURM_NAME.fullmatch(value):
        return None
    return f"{value!r} is not a Slurm name (letters, digits, _ . , : + @ -); leave it empty for the site's default"


def memory_problem(value: str) -> str | None:
    """Memory per node as sbatch --mem takes it."""
    if _MEMORY.fullmatch(value):
        return None
    return f"{value!r} is not a Slurm memory size; write e.g. 480G or 64000M"


def time_problem(value: str) -> str | None:
    """A wall-clock limit as sbatch --time takes it."""
    if _TIME.fullmatch(value):
        return None
    return f"{value!r} is not a Slurm time; write HH:MM:SS or D-HH:MM:SS, e.g. 02:00:00"


def time_seconds(value: str) -> int:
    """Seconds of a time that passed `time_problem`: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    days, _, clock = value.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    else:
        h, m, sec = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + sec


def sbatch_option_problem(value: str) -> str | None:
    """One more #SBATCH option, e.g. --constraint=a100."""
    if not value.startswith("--"):
        return f"{value!r} is not an sbatch option; write it as --name=value"
    return one_line_problem(value)


def one_line_problem(value: str) -> str | None:
    """A value for an #SBATCH line, which cannot hold a line break or a NUL."""
    if any(c in value for c in "\n\r\0"):
        return f"{value!r} contains a line break, which a job script header cannot hold"
    return None


def env_name_problem(name: str) -> str | None:
    """An environment variable name the job script can export."""
    if _ENV_NAME.fullmatch(str(name)):
        return None
    return f"{name!r} is not an environment variable name (letters, digits and _, not starting with a digit)"
