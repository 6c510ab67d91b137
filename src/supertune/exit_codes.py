"""Exit codes that carry meaning between supertune's processes and the job scripts it renders."""

from __future__ import annotations

__all__ = ["REQUEUE_EXIT_CODE"]

REQUEUE_EXIT_CODE = 75
"""Exit code of `supertune train` after a stop on a signal or a stop request (EX_TEMPFAIL): run it
again to resume. The rendered job script requeues the job on it."""
