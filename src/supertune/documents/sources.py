"""Raw documents from local files, a cached hub dataset, or the embedded corpus, split for validation."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.schema import DataConfig
from ..errors import UserError, first_line
from ..file_formats import file_format

__all__ = [
    "RawSplits",
    "check_hub_dataset",
    "load_hub_dataset",
    "load_hub_rows",
    "load_file_rows",
    "load_raw_splits",
    "load_validation_rows",
    "training_files",
    "validation_files",
    "validation_split_name",
]

log = logging.getLogger("supertune")

# Documents held out from a stream for validation when no validation files are given: a stream has
# no length, so a percentage cannot be taken.
STREAM_VALIDATION_DOCS = 200


@dataclass
class RawSplits:
    """Train and validation documents as `datasets` objects (map-style, or iterable when streaming)."""

    train: Any
    validation: Any
    columns: list[str]
    validation_from: str = "files"
    """Where the validation documents came from: "files", "split:<name>" (a dataset's split) or "held_out"."""


def training_files(d: DataConfig, embedded: tuple[Path, Path] | None = None) -> list[str]:
    """The training files, with the embedded corpus standing in when none are configured
    (`embedded`: the (train, validation) files that stand in instead of data.format's)."""
    if d.train_files:
        return list(d.train_files)
    if d.dataset_name:
        return []
    return [str((embedded or _embedded(d))[0])]


def validation_files(d: DataConfig, embedded: tuple[Path, Path] | None = None) -> list[str]:
    """The validation files, with the embedded corpus's own standing in when no data is configured."""
    if d.validation_files or d.train_files or d.dataset_name:
        return list(d.validation_files)
    return [str((embedded or _embedded(d))[1])]


def _embedded(d: DataConfig) -> tuple[Path, Path]:
    """The embedded data of data.format: the conversations for chat, the stories otherwise."""
    from ..embedded import chat_corpus, default_corpus

    corpus = chat_corpus() if d.format == "chat" else default_corpus()
    return corpus.train, corpus.validation


def load_raw_splits(
    d: DataConfig,
    seed: int,
    embedded: tuple[Path, Path] | None = None,
    needed: list[tuple[str, str]] | None = None,
    needed_fix: str = "",
) -> RawSplits:
    """Load the configured documents and their validation split (data.validation_split: files, a
    dataset's split, or validation_split_percentage held out), each cut to max_*_samples (data.sample).
    `embedded`: the (train, validation) files standing in for no data instead of data.format's;
    `needed`: the columns the rows must have instead of data.format's, as (config key, column) pairs;
    `needed_fix` ends the error of a missing one."""
    if d.dataset_name:
        loaded = load_hub_dataset(d)
        split = validation_split_name(d, list(loaded))
        validation_from = f"split:{split}" if split else "held_out"
    else:
        train = training_files(d, embedded)
        files: dict[str, list[str]] = {"train": train}
        validation = validation_files(d, embedded)
        if validation:
            files["validation"] = validation
        loaded = _load_files(files, d.streaming)
        split = "validation" if validation else None
        validation_from = "files" if validation else "held_out"
    train = loaded["train"]
    validation = loaded[split] if split else None
    columns = list(train.column_names or [])
    if validation is None:
        train, validation = _hold_out(train, d, seed)
    _log_validation(d, validation_from, seed)
    train = _sample(train, d.max_train_samples, d, seed)
    validation = _sample(validation, d.max_eval_samples, d, seed)
    if needed is None:
        _check_columns(d, columns)
    else:
        _check_needed(needed, columns, needed_fix)
    return RawSplits(train, validation, columns, validation_from)


def validation_split_name(d: DataConfig, splits: list[str]) -> str | None:
    """The split of data.dataset_name to evaluate on (data.validation_split), None to hold out a
    percentage of train; a UserError with the dataset's splits when the one named is not there."""
    if d.validation_split == "auto":
        return next((name for name in ("validation", "test") if name in splits), None)
    if d.validation_split not in splits:
        raise UserError(
            f"data.validation_split: {d.dataset_name!r} has no split {d.validation_split!r} (its splits: "
            f"{', '.join(splits)}); name one of them, or use auto"
        )
    return d.validation_split


def _log_validation(d: DataConfig, validation_from: str, seed: int) -> None:
    if validation_from.startswith("split:"):
        how = (
            " (it has no validation split)" if d.validation_split == "auto" and validation_from == "split:test" else ""
        )
        log.info("data: evaluating on the %r split of %s%s", validation_from[6:], d.dataset_name, how)
    elif validation_from == "held_out":
        where = f"{d.dataset_name} has no validation or test split" if d.dataset_name else "no validation files"
        amount = f"{STREAM_VALIDATION_DOCS} documents" if d.streaming else f"{d.validation_split_percentage} %"
        log.info("data: %s: %s of the training data held out for validation (seed %d)", where, amount, seed)


def _sample(rows: Any, limit: int | None, d: DataConfig, seed: int) -> Any:
    """At most `limit` documents: the first ones, or (data.sample shuffled) those first after a
    shuffle by `seed`, as rows.shuffle(seed=seed).select(range(limit)) takes them. A stream is
    shuffled in a buffer of data.shuffle_buffer documents."""
    if not limit:
        return rows
    if d.streaming:
        return (rows.shuffle(seed=seed, buffer_size=d.shuffle_buffer) if d.sample == "shuffled" else rows).take(limit)
    if d.sample == "shuffled":
        rows = rows.shuffle(seed=seed)
    return rows.select(range(min(limit, len(rows))))


def load_validation_rows(d: DataConfig, seed: int) -> Any:
    """The documents a run with these data settings evaluates on, chosen as training chose them:
    the validation files (the embedded corpus's validation split when no data is set), else the
    dataset's validation split or the share of training documents held out by `seed` (training.seed).
    Cut to max_eval_samples; always map-style (a stream's held-out documents are read into memory:
    STREAM_VALIDATION_DOCS of them)."""
    files = validation_files(d)
    if not files:
        validation = load_raw_splits(d, seed).validation
        if d.streaming:
            import datasets

            validation = datasets.Dataset.from_list(list(validation))
        return validation
    rows = _load_files({"validation": files}, streaming=False)["validation"]
    rows = _sample(rows, d.max_eval_samples, d, seed)
    _check_columns(d, list(rows.column_names))
    return rows


def load_file_rows(d: DataConfig, files: list[str]) -> Any:
    """The rows of `files` in their order, unsplit and unsampled (map-style): what a row's number in
    an error message counts."""
    rows = _load_files({"rows": files}, streaming=False)["rows"]
    _check_columns(d, list(rows.column_names))
    return rows


def load_hub_rows(d: DataConfig) -> dict[str, Any]:
    """The splits of data.dataset_name a run reads rows from, unsplit and unsampled: "train" and the
    validation split data.validation_split names (when the dataset has one); what a row's number in
    an error message counts. Iterable when data.streaming."""
    loaded = load_hub_dataset(d)
    names = ["train", validation_split_name(d, list(loaded))]
    splits = {name: loaded[name] for name in names if name is not None and name in loaded}
    if "train" in splits:
        _check_columns(d, list(splits["train"].column_names or []))
    return splits


def _load_files(files: dict[str, list[str]], streaming: bool) -> Any:
    import datasets

    datasets.disable_progress_bars()  # the run's own progress bar is the training one
    builder = file_format(next(iter(files.values()))[0])
    kwargs = {"sample_by": "line"} if builder == "text" else {}
    if builder == "text" and not streaming and _small_plain_text(files):
        return _read_text_lines(files)
    # datasets logs the parse error of an unreadable file before raising it; the UserError below says it once.
    quiet, level = logging.getLogger("datasets"), logging.getLogger("datasets").level
    quiet.setLevel(logging.CRITICAL)
    try:
        return datasets.load_dataset(builder, data_files=files, streaming=streaming, **kwargs)
    except Exception as exc:  # datasets raises many types for unreadable files; all mean the same to the user
        while exc.__cause__ is not None:  # "An error occurred while generating the dataset" wraps the reason
            exc = exc.__cause__  # type: ignore[assignment]
        first = first_line(exc)
        raise UserError(f"data: cannot read {builder} files {files}: {first}") from None
    finally:
        quiet.setLevel(level)


# Text read into memory up to this size; above it datasets' text builder writes its Arrow cache to
# disk once and memory-maps it, so a corpus larger than memory still loads.
IN_MEMORY_TEXT_BYTES = 1 << 30


def _small_plain_text(files: dict[str, list[str]]) -> bool:
    paths = [f for fs in files.values() for f in fs]
    if not all(os.path.splitext(f)[1].lower() in (".txt", ".text") for f in paths):  # not compressed
        return False
    try:
        return sum(os.path.getsize(f) for f in paths) <= IN_MEMORY_TEXT_BYTES
    except OSError:
        return False  # the builder names the missing file


def _read_text_lines(files: dict[str, list[str]]) -> Any:
    """Uncompressed text files as the rows `datasets`' text builder (sample_by="line") gives, in memory.

    The same rows: "\r\n" and "\r" become "\n" (as text mode reads them), lines split on "\n" only,
    line breaks dropped, blank lines kept, no empty last row after a final newline (a test compares
    the two on such files). The lines go into one Arrow string array straight from the file's bytes:
    no Python string per line, and no Arrow cache written and read back (which took 13 % of
    `supertune prepare`'s time on 21 MB of wikitext; Python strings per line, another 7 %).
    """
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    splits = {}
    for split, paths in files.items():
        chunks = [_text_file_lines(path) for path in paths]
        table = pa.table({"text": pa.chunked_array(chunks, type=pa.string())})
        # datasets would fingerprint the table by pickling and hashing all of it (half of this
        # function's time); the files' names, sizes and times name the same rows.
        splits[split] = datasets.Dataset(InMemoryTable(table), fingerprint=_files_fingerprint(paths))
    return datasets.DatasetDict(splits)


def _files_fingerprint(paths: list[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for path in paths:
        st = os.stat(path)
        digest.update(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _text_file_lines(path: str) -> Any:
    """One file's lines as an Arrow string array (files under 2 GiB: 32-bit offsets suffice)."""
    import numpy as np
    import pyarrow as pa

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UserError(f"data: cannot read text file {path!r}: {exc}") from None
    if b"\r" in data:  # the byte 0x0D occurs in UTF-8 only as the character itself
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    raw = np.frombuffer(data, dtype=np.uint8)
    breaks = np.flatnonzero(raw == ord("\n"))
    ends = breaks - np.arange(len(breaks))  # each line's end once the line breaks before it are removed
    if len(data) and data[-1:] != b"\n":
        ends = np.append(ends, len(data) - len(breaks))  # a last line without a line break
    offsets = np.concatenate([[0], ends]).astype(np.int32)
    body = data.replace(b"\n", b"")
    lines = pa.StringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(body))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        bad = _first_bad_utf8(data)
        raise UserError(
            f"data: cannot read text file {path!r}: not UTF-8 ({bad}); convert it, e.g. with iconv -t UTF-8"
        ) from None
    return lines


def _first_bad_utf8(data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"byte {exc.start}"
    return "invalid string"


def check_hub_dataset(d: DataConfig) -> None:
    """Refuse (UserError) a hub dataset name when the hub cannot be reached and the datasets cache
    is not to be used: a probe of a few seconds at most, instead of the client's minutes of retries."""
    from huggingface_hub import constants

    from ..hub import reachable

    if d.dataset_name is None:
        return
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    # A local dataset directory is read without the hub (datasets does not ask it), so only a hub
    # name needs the probe: compute nodes without internet are the usual place for local ones.
    local = Path(d.dataset_name).expanduser().is_dir()
    if not offline and not local and not reachable(constants.ENDPOINT):
        raise UserError(
            f"data.dataset_name: the hub ({constants.ENDPOINT}) cannot be reached to read {d.dataset_name!r}; "
            "set HF_DATASETS_OFFLINE=1 to use the local datasets cache, or give data.train_files"
        )


def load_hub_dataset(d: DataConfig) -> Any:
    """The hub dataset of data.dataset_name from the local datasets cache (all its splits)."""
    import datasets

    check_hub_dataset(d)
    try:
        return datasets.load_dataset(d.dataset_name, d.dataset_config, streaming=d.streaming)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        first = first_line(exc)
        raise UserError(
            f"data.dataset_name: cannot load {d.dataset_name!r}"
            f"{' (' + d.dataset_config + ')' if d.dataset_config else ''} from the local cache: {first}"
        ) from None


def _hold_out(train: Any, d: DataConfig, seed: int) -> tuple[Any, Any]:
    if d.streaming:
        return train.skip(STREAM_VALIDATION_DOCS), train.take(STREAM_VALIDATION_DOCS)
    if len(train) < 2:
        raise UserError("data.train_files: fewer than 2 documents; add data or give data.validation_files")
    split = train.train_test_split(test_size=d.validation_split_percentage / 100, seed=seed, shuffle=True)
    return split["train"], split["test"]


def _check_columns(d: DataConfig, columns: list[str]) -> None:
    if not columns:  # some streamed datasets only know their columns once read
        return
    if d.format == "chat":
        needed, field = [d.messages_field], "data.messages_field"
    elif d.format == "prompt_completion":
        parts = [
            (template, _template_fields(template), f"data.{name}_template")
            if template is not None
            else (None, [column], f"data.{name}_field")
            for name, template, column in (
                ("prompt", d.prompt_template, d.prompt_field),
                ("completion", d.completion_template, d.completion_field),
            )
        ]
        needed = [c for _, fields, _ in parts for c in fields]
        field = next((key for _, fields, key in parts if any(c not in columns for c in fields)), "")
    else:
        needed = _template_fields(d.template) if d.template else [d.text_field]
        field = "data.template" if d.template else "data.text_field"
    missing = [c for c in needed if c not in columns]
    if missing:
        hint = ""
        if d.format == "text" and d.messages_field in columns:
            hint = f"; the rows are conversations ({d.messages_field!r}): set data.format=chat"
        elif d.format == "text" and d.prompt_field in columns and d.completion_field in columns:
            hint = "; the rows are prompt/completion pairs: set data.format=prompt_completion"
        raise UserError(f"{field}: column {missing[0]!r} is not in the data (columns: {', '.join(columns)}){hint}")


def _check_needed(needed: list[tuple[str, str]], columns: list[str], fix: str) -> None:
    if not columns:
        return
    for key, column in needed:
        if column not in columns:
            end = f"; {fix}" if fix else ""
            raise UserError(f"{key}: column {column!r} is not in the data (columns: {', '.join(columns)}){end}")


def _template_fields(template: str) -> list[str]:
    import string

    return [f for _, f, _, _ in string.Formatter().parse(template) if f]
