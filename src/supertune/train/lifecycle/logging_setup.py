"""Console logging of a run: supertune's own lines on the main process, libraries kept quiet."""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["setup_logging", "quiet_trainer_dicts", "verbose_logs", "VERBOSE_VARIABLE"]

VERBOSE_VARIABLE = "SUPERTUNE_VERBOSE"
"""Set to 1 (`supertune train --verbose` does, for its workers too): every library line is shown."""

SILENCED = {
    "DeepSpeed": "Setting accelerator to CPU",
}
"""Library log lines that say nothing on the machines where they appear (docs/runs.md lists why)."""


def verbose_logs() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


def setup_logging() -> None:
    from ...launch.environment import launch_environment

    rank = launch_environment().rank
    if not verbose_logs():
        # DeepSpeed's logger is made when it is imported (a DeepSpeed run, or a library that imports
        # it to recognise its engine); its filters are kept from here on.
        for name, start in SILENCED.items():
            logging.getLogger(name).addFilter(_DropStartingWith(start))
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level, format="%(asctime)s supertune: %(message)s", datefmt="%H:%M:%S", handlers=[_CurrentStderr()]
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if rank == 0 else "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning() if rank == 0 else hf_logging.set_verbosity_error()
    from ..trainer.progress import progress_bar_wanted

    if not progress_bar_wanted():
        # In a job log, the libraries' bars (tokenizing, saving shards) would be lines of carriage
        # returns; supertune logs its own progress lines there instead.
        _quiet_progress_bars()
    # Known, harmless, and printed once per rank otherwise.
    warnings.filterwarnings("ignore", message=".*torch.utils._pytree._register_pytree_node.*")
    # DeepSpeed calls collectives that torch 2.13 renamed; torch warns on every call, every step.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        category=FutureWarning,
    )


def quiet_trainer_dicts(trainer) -> None:
    """The Trainer's own print of every log record as a raw dict (PrinterCallback in a job log, the bar's
    write in a terminal): supertune's progress lines, metrics.jsonl and TensorBoard carry the same numbers."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(_bar_without_dicts())


class _DropStartingWith(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def _bar_without_dicts():
    from transformers.trainer_callback import ProgressCallback

    class BarWithoutDicts(ProgressCallback):
        """The Trainer's progress bar, without the raw dict it writes under the bar at every log."""

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ARG002
            return None

    return BarWithoutDicts


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to sys.stderr as it is at each record, not as it was when logging was set
    up: a caller in the same process that swaps stderr and closes its stand-in (a test's capture, a
    notebook cell) otherwise leaves a handler on a closed file, and every later record prints
    "--- Logging error ---" with a traceback."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _quiet_progress_bars() -> None:
    import datasets
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    disable_progress_bars()
