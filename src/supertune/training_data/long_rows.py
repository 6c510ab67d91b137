"""What the log says about rows longer than a sequence: how many, and what happens to them.

Conversations and prompt/completion rows longer than a sequence are kept and cut as any document
is (never refused); the count is the user's one sign that answers were cut. Whole-read splits and
token stores count before the first step; a stream counts as it reads (rows_longer_than below).
"""

from __future__ import annotations

import logging

from ..config.schema import DataConfig

__all__ = ["log_longer", "rows_name", "sequence_limit"]

log = logging.getLogger("supertune")


def rows_name(d: DataConfig) -> str:
    return "conversations" if d.format == "chat" else "rows"


def sequence_limit(d: DataConfig) -> int | None:
    """The tokens a row may have before it is cut: the block when packing, else data.max_length (None: not cut)."""
    return d.block_size if d.packing else d.max_length


def log_longer(d: DataConfig, name: str, longer: int, total: int, limit: int, so_far: bool = False) -> None:
    """One warning when any of `total` rows of split `name` are longer than `limit` tokens: the count and the cut."""
    if not longer:
        return
    if d.packing and d.document_mask:
        how = f"each is cut into pieces of {limit} tokens, and a piece does not see the one before it"
    elif d.packing:
        how = f"they run across block edges (of {limit} tokens) as every packed document does"
    else:
        how = f"each is truncated at data.max_length={limit}, and the turns past it are not trained"
    of = "read so far" if so_far else ""
    log.warning(
        "%s: %d of %d %s %s%s are longer than %d tokens: %s",
        d.format,
        longer,
        total,
        name,
        rows_name(d),
        f" {of}" if of else "",
        limit,
        how,
    )
