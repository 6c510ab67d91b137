"""Federated averaging: `supertune average` and the pieces the federated rounds build on.

`average_checkpoints` averages run directories, checkpoints, saved models or LoRA adapters, weighted
by tokens seen (by default), streaming a slice of a tensor at a time, with an optional server
step (FedAvgM, Nesterov momentum, FedAdam, FedYogi, FedAdagrad); everything it refuses is refused
before anything is written (docs/federated.md).
Importing this package imports numpy, not torch; an FSDP run's sharded checkpoint among the inputs
imports torch and transformers to read it (sharded_input.py).
"""

from .average import DEFAULT_MAX_SHARD_BYTES, average_checkpoints
from .checks import tokenizer_sha256
from .inputs import AVERAGE_MANIFEST, ModelInput, resolve_input
from .manifest import AverageManifest, read_average_manifest
from .server_optimizers import SERVER_OPTIMIZERS, default_lr, default_momentum
from .server_step import MOMENTUM_FILE, SECOND_MOMENT_FILE, ServerStep
from .streamer import CHUNK_ELEMENTS
from .weights import InputWeights, input_weights, parse_weights

__all__ = [
    "AVERAGE_MANIFEST",
    "AverageManifest",
    "CHUNK_ELEMENTS",
    "DEFAULT_MAX_SHARD_BYTES",
    "InputWeights",
    "MOMENTUM_FILE",
    "SECOND_MOMENT_FILE",
    "SERVER_OPTIMIZERS",
    "ModelInput",
    "ServerStep",
    "average_checkpoints",
    "default_lr",
    "default_momentum",
    "input_weights",
    "parse_weights",
    "read_average_manifest",
    "resolve_input",
    "tokenizer_sha256",
]
