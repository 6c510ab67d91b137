"""Federated averaging: `supertune average` and the pieces the federated rounds build on.

`average_checkpoints` averages run directories, checkpoints, saved models or LoRA adapters, weighted
by tokens seen (by default), streaming a slice of a tensor at a time, with an optional server
step (FedAvgM, Nesterov momentum, FedAdam, FedYogi, FedAdagrad: the records of
server_optimizers.py); everything it refuses is refused before anything is written
(docs/federated/average.md).
Importing this package imports nothing: each name below is imported from its module when first
used, so that `supertune average --help` reads the server optimizers' records without numpy. Using
the averaging imports numpy, not torch; an FSDP run's sharded checkpoint among the inputs imports
torch and transformers to read it (sharded_input.py).
"""

from importlib import import_module
from typing import Any

# name -> the module of this package that defines it
_WHERE = {
    "DEFAULT_MAX_SHARD_BYTES": "average",
    "average_checkpoints": "average",
    "tokenizer_sha256": "checks",
    "AVERAGE_MANIFEST": "inputs",
    "ModelInput": "inputs",
    "resolve_input": "inputs",
    "AverageManifest": "manifest",
    "read_average_manifest": "manifest",
    "SERVER_OPTIMIZERS": "server_optimizers",
    "default_lr": "server_optimizers",
    "default_momentum": "server_optimizers",
    "MOMENTUM_FILE": "server_step",
    "SECOND_MOMENT_FILE": "server_step",
    "ServerStep": "server_step",
    "CHUNK_ELEMENTS": "streamer",
    "InputWeights": "weights",
    "input_weights": "weights",
    "parse_weights": "weights",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_WHERE)
