"""The typed run config: schema, building from data, validation, documentation.

A new run's config is resolved from its layers (defaults, cluster profile, YAML, command line) by
`supertune.resolve`, which sits above this package and the cluster profiles; a saved config is
read back as it is with `load_saved_config`.
"""

from .build import build_config
from .errors import ConfigError
from .load import build_run_config, config_to_dict, dump_config, load_saved_config
from .schema import (
    DataConfig,
    GenerateConfig,
    LaunchConfig,
    LoraConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    TrainingConfig,
)
from .validate import validate
from .yaml_file import read_config_file, read_yaml_mapping

__all__ = [
    "ConfigError",
    "DataConfig",
    "GenerateConfig",
    "LaunchConfig",
    "LoraConfig",
    "ModelConfig",
    "OutputConfig",
    "RunConfig",
    "TrainingConfig",
    "build_config",
    "build_run_config",
    "config_to_dict",
    "dump_config",
    "load_saved_config",
    "read_config_file",
    "read_yaml_mapping",
    "validate",
]
