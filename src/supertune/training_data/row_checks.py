"""Conversations and prompt/completion rows checked before a run directory exists.

Every row of the data files is checked for its shape (a conversation's roles and last turn, a
prompt's and a completion's text), and the first batch is rendered with the run's chat template and
encoded, so a bad row or a template that cannot mark the answers is refused with the row's number in
its files and nothing left behind. The training processes encode every row again (and refuse a bad
one before the first step): the shapes cost a pass over the rows, the template the first
BATCH_DOCS conversations, against the whole data's encoding that training does anyway.
"""

from __future__ import annotations

from typing import Any

from ..config.schema import DataConfig
from ..conversations.encoding import check_rows, encode_rows
from ..documents.encoding import iter_row_batches
from ..documents.sources import load_file_rows, training_files, validation_files

__all__ = ["check_rows_before_start"]


def check_rows_before_start(d: DataConfig, tokenizer: Any) -> None:
    """Refuse (UserError) the first bad row of the training and validation files (data.format chat or
    prompt_completion; hub datasets are checked by the training processes)."""
    for name, files in (("the training files", training_files(d)), ("the validation files", validation_files(d))):
        if not files:
            continue
        first = 0
        for i, rows in enumerate(iter_row_batches(load_file_rows(d, files))):
            if i == 0:
                encode_rows(rows, d, tokenizer, name, 0)
            else:
                check_rows(rows, d, name, first)
            first += len(next(iter(rows.values()))) if rows else 0
