"""Console logging of a run: supertune's own lines on the main process, libraries kept quiet."""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["setup_logging"]


def setup_logging() -> None:
    from ..launch.environment import launch_environment

    rank = launch_environment().rank
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level, format="%(asctime)s supertune: %(message)s", datefmt="%H:%M:%S", handlers=[_CurrentStderr()]
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if rank == 0 else "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning() if rank == 0 else hf_logging.set_verbosity_error()
    from .progress import progress_bar_wanted

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
