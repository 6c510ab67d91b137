"""Resolving a run's config from its layers (defaults, cluster profile, YAML, command line), once,
when the run is created; and reading a run directory's resolved config back as it is.

This package sits above the run config (`supertune.config`) and the cluster profiles
(`supertune.clusters`), which know nothing of each other's loading.
"""

from .origin_text import origin_lines
from .record import resolution_record, write_resolution
from .resolve import COMMAND_LINE, Resolution, load_run_dir_config, resolve, resolve_run_config

__all__ = [
    "COMMAND_LINE",
    "Resolution",
    "load_run_dir_config",
    "origin_lines",
    "resolution_record",
    "resolve",
    "resolve_run_config",
    "write_resolution",
]
