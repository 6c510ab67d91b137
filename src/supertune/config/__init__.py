"""The typed run config: schema, loading with overrides, validation, documentation."""

from .build import build_config
from .errors import ConfigError
from .load import config_to_dict, dump_config, load_run_config, read_yaml
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
    "config_to_dict",
    "dump_config",
    "load_run_config",
    "read_yaml",
    "validate",
]
