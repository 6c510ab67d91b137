"""The files of an average's output beside its tensors: config, tokenizer and the shard index. The
output directory itself is staged and published by supertune.output_dirs.Staging, so that a killed
average leaves nothing that looks complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..durable_files import fsync_file, write_synced
from .inputs import ADAPTER_CONFIG, GENERATION_CONFIG, MODEL_CONFIG, ModelInput

__all__ = ["copy_side_files", "free_bytes", "write_index"]

_TORCH_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def copy_side_files(
    source: ModelInput, staging: Path, names: list[str], dtype: str | None, config_source: ModelInput | None = None
) -> list[str]:
    """Copy config, generation config, adapter config and tokenizer files; config.json's dtype set to the output's."""
    written = []
    for name in names:
        origin = (
            config_source
            if config_source is not None and name in (MODEL_CONFIG, GENERATION_CONFIG, ADAPTER_CONFIG)
            else source
        )
        src = origin.directory / name
        if not src.is_file():
            continue
        if name == MODEL_CONFIG and dtype in _TORCH_DTYPE_NAMES:
            config = json.loads(src.read_text(encoding="utf-8"))
            config["dtype"] = _TORCH_DTYPE_NAMES[dtype]
            if "torch_dtype" in config:
                config["torch_dtype"] = _TORCH_DTYPE_NAMES[dtype]
            write_synced(staging / name, json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(src, staging / name)
            fsync_file(staging / name)
        written.append(name)
    return written


def write_index(staging: Path, weight_map: dict[str, str], total_size: int, stem: str = "model") -> str:
    """model.safetensors.index.json: which shard holds each tensor (how Hugging Face loaders find them)."""
    name = f"{stem}.safetensors.index.json"
    data: dict[str, Any] = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    write_synced(staging / name, json.dumps(data, indent=2) + "\n")
    return name


def free_bytes(path: Path) -> int:
    """Free space on the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free
