"""A site's failed or late work: the one error that says so (FederationError, raised by every
executor and by StreamFlow's site step alike), with the short reason the round table shows, and the
wording of those reasons (attempts.py cuts them)."""

from __future__ import annotations

from typing import Any

from ...errors import UserError
from ..config.durations import deadline_seconds, duration_text
from ..config.schema import FederationConfig

__all__ = ["FederationError", "SiteLate", "deadline_text", "job_exit_text", "late_job_reason"]


class FederationError(UserError):
    """A site's work failed; the message names the site, the round and where its log is; `reason` is
    the short form the round table shows (failed: exit 1, refused: ..., late: ...)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class SiteLate(FederationError):
    """A site's training was still running at the round's deadline and was ended."""


def deadline_text(fed: FederationConfig) -> str:
    """The round's deadline as the reasons say it: 2h, 1h30m, 10s."""
    return duration_text(deadline_seconds(fed.round_deadline) or 0.0)


def job_exit_text(state: Any) -> str:
    """`exit 1`, `killed by signal 9`, or the job's state: what a failed SLURM job's reason says."""
    code, _, sig = (state.exit_code or "").partition(":")
    if sig.isdigit() and int(sig):
        return f"killed by signal {sig} (job {state.state})"
    if code.isdigit() and int(code):
        return f"exit {code}"
    return f"job {state.state}"


def late_job_reason(state: Any, wait: str) -> str:
    """Why a SLURM job unfinished at the round's deadline is late: `late: still queued after 2h`, `late:
    held in the queue after 2h` (scontrol hold, sbatch --hold), `late: running after 2h`."""
    queued = state.state in ("PENDING", "CONFIGURING", "REQUEUED")
    held = queued and state.reason in ("JobHeldUser", "JobHeldAdmin")
    return f"late: {'held in the queue' if held else 'still queued' if queued else 'running'} after {wait}"
