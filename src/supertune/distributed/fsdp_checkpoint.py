"""Sharded checkpoints of an FSDP run: each rank writes and reads its own shards with torch
distributed checkpoint (DCP); no rank gathers the whole model or optimizer state.

Inside a checkpoint directory (supertune.checkpoints.layout publishes it with its manifest):

    fsdp_model/       .metadata and one __<rank>_0.distcp per rank: parameters and buffers by name
    fsdp_optimizer/   the same for the optimizer state (AdamW moments and step), keyed by parameter name

The state dicts are torch's own (`torch.distributed.checkpoint.state_dict`): DTensor shards keyed by
the unsharded parameter names, so a file says which slice of which tensor it holds. `.metadata`
(written by rank 0 once every rank has written its file) maps every slice to its file and offset.

Loading reads into the sharding the model has now: DCP copies each stored slice into the ranks whose
shards overlap it. A checkpoint written by N processes therefore loads into M (another
`--nproc`, or hybrid to full), and the tensors are the ones saved, element for element.

Costs: each rank writes its own share (fp32 weights and AdamW's two moments: 12 bytes a parameter
over the shard count; shards replicated across nodes under hybrid are written once); the main
process then reads every rank's files once to hash them for the manifest, as for DeepSpeed's, so
the checkpoint directory must be on a file system all nodes see.

Reading without the run: `FullTensorReader` lists the model's tensors from `.metadata` alone and
assembles one of them whole in one process with no process group (DCP's `no_dist` load into a
tensor of the full shape), which is how `supertune average` reads an FSDP checkpoint: one tensor in
memory at a time, plus the stored slice being copied into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "MODEL_DIR",
    "OPTIMIZER_DIR",
    "is_sharded_checkpoint",
    "save_sharded_model",
    "save_sharded_optimizer",
    "load_sharded_model",
    "load_sharded_optimizer",
    "sharded_model_files",
    "FullTensorReader",
]

MODEL_DIR = "fsdp_model"
OPTIMIZER_DIR = "fsdp_optimizer"
_METADATA = ".metadata"


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether `path` holds an FSDP run's sharded model (the metadata DCP writes last)."""
    return (Path(path) / MODEL_DIR / _METADATA).is_file()


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under accelerate's wrapper: DCP matches its parameters to the model's."""
    return getattr(optimizer, "optimizer", optimizer)


def save_sharded_model(model: Any, checkpoint: Path) -> None:
    """Every rank writes its shards of the parameters and buffers into checkpoint/fsdp_model (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save(get_model_state_dict(model), checkpoint_id=Path(checkpoint) / MODEL_DIR)


def save_sharded_optimizer(model: Any, optimizer: Any, checkpoint: Path) -> None:
    """Every rank writes its shards of the optimizer state into checkpoint/fsdp_optimizer (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, _torch_optimizer(optimizer))
    dcp.save(state, checkpoint_id=Path(checkpoint) / OPTIMIZER_DIR)


def load_sharded_model(model: Any, checkpoint: Path) -> None:
    """Every rank reads the slices of its shards from checkpoint/fsdp_model into the model (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=Path(checkpoint) / MODEL_DIR)
    set_model_state_dict(model, state)


def load_sharded_optimizer(model: Any, optimizer: Any, checkpoint: Path) -> None:
    """Every rank reads its shards of the optimizer state from checkpoint/fsdp_optimizer (collective).

    torch's get_optimizer_state_dict first gives a fresh AdamW its state tensors (a step with zero
    gradients and learning rate 0, which leaves the weights as they are) so there is a place to load into.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    optim = _torch_optimizer(optimizer)
    state = get_optimizer_state_dict(model, optim)
    dcp.load(state, checkpoint_id=Path(checkpoint) / OPTIMIZER_DIR)
    set_optimizer_state_dict(model, optim, state)


def sharded_model_files(checkpoint: Path) -> list[Path]:
    """The files of checkpoint/fsdp_model: the metadata, then every rank's file."""
    folder = Path(checkpoint) / MODEL_DIR
    return [folder / _METADATA] + sorted(p for p in folder.glob("*.distcp") if p.is_file())


class FullTensorReader:
    """checkpoint/fsdp_model read back one whole tensor at a time, in this process, with no process
    group: DCP's `no_dist` load into a tensor of the full shape. `.metadata` is unpickled once (DCP
    would read it again for every load: a rank count x tensor count of entries each time).

    Memory per read: the tensor, plus the one stored slice DCP deserialises before copying it in
    (the tensor over the shard count). Raises what unpickling the metadata raises."""

    def __init__(self, checkpoint: Path) -> None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self._reader = FileSystemReader(Path(checkpoint) / MODEL_DIR)
        metadata = self._reader.read_metadata()

        def read_metadata(*args: Any, **kwargs: Any) -> Any:
            metadata.storage_meta.load_id = self._reader.load_id  # as FileSystemReader sets it
            return metadata

        self._reader.read_metadata = read_metadata  # type: ignore[method-assign]
        self.tensors: dict[str, tuple[Any, tuple[int, ...]]] = {
            name: (item.properties.dtype, tuple(int(x) for x in item.size))
            for name, item in metadata.state_dict_metadata.items()
            if isinstance(item, TensorStorageMetadata)
        }
        """{name: (torch dtype, full shape)} of every tensor, in the order they were saved (the model's)."""

    def read(self, name: str) -> Any:
        """Tensor `name` whole, assembled from every rank's slices. ValueError naming the reason when a
        file cannot be read (DCP wraps it in a CheckpointException, which is no Exception)."""
        import warnings

        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        dtype, shape = self.tensors[name]
        tensor = torch.empty(shape, dtype=dtype)
        try:
            with warnings.catch_warnings():
                # "torch.distributed is disabled ... assuming ... a single process": that is the intent here
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load({name: tensor}, storage_reader=self._reader, no_dist=True)
        except CheckpointException as exc:
            raise ValueError(_reason(next(iter(exc.failures.values()))[0])) from None
        except Exception as exc:
            raise ValueError(_reason(exc)) from None
        return tensor


def _reason(exc: BaseException) -> str:
    """The exception's type and first sentence (torch.load's own advice after it is not for this case)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text.split('. ')[0]}" if text else type(exc).__name__
