"""Console logging of a run: supertune's own lines on the main process, libraries kept quiet."""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["setup_logging"]


def setup_logging() -> None:
    from ..launch.environment import launch_environment

    rank = launch_environment().rank
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s supertune: %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if rank == 0 else "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning() if rank == 0 else hf_logging.set_verbosity_error()
    # Known, harmless, and printed once per rank otherwise.
    warnings.filterwarnings("ignore", message=".*torch.utils._pytree._register_pytree_node.*")
    # DeepSpeed calls collectives that torch 2.13 renamed; torch warns on every call, every step.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated", category=FutureWarning)
