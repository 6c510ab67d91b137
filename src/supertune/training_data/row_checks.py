"""Conversations and prompt/completion rows checked before a run directory exists.

Every row of the data files, or of a hub dataset's splits read from the local cache, is checked for
its shape (a conversation's roles and last turn, a prompt's and a completion's text), and the first
batch is rendered with the run's chat template and encoded, so a bad row or a template that cannot
mark the answers is refused with the row's number and nothing left behind. The training processes
encode every row again (and refuse a bad one before the first step): the shapes cost a pass over
the rows, the template the first BATCH_DOCS conversations, against the whole data's encoding that
training does anyway. A streamed hub dataset (data.streaming) is checked on its first BATCH_DOCS
rows only: reading a whole stream before the run would defeat streaming; its other rows are checked
by the training processes as they arrive.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from ..config.schema import DataConfig
from ..conversations.encoding import check_rows, encode_rows
from ..documents.encoding import iter_row_batches
from ..documents.sources import load_file_rows, load_hub_rows, training_files, validation_files

__all__ = ["check_rows_before_start"]


def check_rows_before_start(d: DataConfig, tokenizer: Any) -> None:
    """Refuse (UserError) the first bad row of the training and validation data (data.format chat or
    prompt_completion): files, or a hub dataset's training and validation splits."""
    for name, rows in _sources(d):
        first = 0
        for i, batch in enumerate(rows):
            if i == 0:
                encode_rows(batch, d, tokenizer, name, 0)
            else:
                check_rows(batch, d, name, first)
            first += len(next(iter(batch.values()))) if batch else 0


def _sources(d: DataConfig) -> Iterator[tuple[str, Iterator[dict[str, list[Any]]]]]:
    """(where, batches of rows) of each source of the run's rows, as an error names it."""
    if d.dataset_name:
        for split, rows in load_hub_rows(d).items():  # the local cache (or the hub, when it can be reached)
            batches = iter_row_batches(rows)
            yield f"the {split!r} split of {d.dataset_name}", itertools.islice(batches, 1) if d.streaming else batches
        return
    for name, files in (("the training files", training_files(d)), ("the validation files", validation_files(d))):
        if files:
            yield name, iter_row_batches(load_file_rows(d, files))
