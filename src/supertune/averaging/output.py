"""The output directory of an average: written in a staging directory beside it and renamed into place
at the end, so that a killed average leaves nothing that looks complete.

    <parent>/.<name>.partial-<pid>/   while writing (removed on any failure; a killed run's is removed
                                      by the next run to the same output)
    <parent>/<name>/                  appears whole, by one rename, after every file is flushed
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..durable_files import fsync_dir, fsync_file, write_synced
from ..errors import UserError
from .inputs import ADAPTER_CONFIG, GENERATION_CONFIG, MODEL_CONFIG, ModelInput

__all__ = ["StagingDir", "copy_side_files", "free_bytes", "write_index"]

_TORCH_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


class StagingDir:
    """Where an average writes before it is published as `out`."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out).expanduser().absolute()
        self.path = self.out.parent / f".{self.out.name}.partial-{os.getpid()}"
        self.published = False

    def __enter__(self) -> StagingDir:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        self.path.mkdir()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.published:
            shutil.rmtree(self.path, ignore_errors=True)

    def _remove_stale(self) -> None:
        """Remove what an average killed while writing to the same output left; refuse while one still runs."""
        for leftover in self.out.parent.glob(f".{self.out.name}.partial-*"):
            pid = leftover.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
                raise UserError(
                    f"--out {self.out}: process {pid} is writing an average there ({leftover}); wait for it, or remove that directory if it is gone"
                )
            shutil.rmtree(leftover, ignore_errors=True)

    def publish(self) -> None:
        """Flush the staging directory and rename it to the output (an empty output directory is replaced)."""
        fsync_dir(self.path)
        if self.out.is_dir():
            self.out.rmdir()  # checked empty before anything was written
        os.rename(self.path, self.out)
        fsync_dir(self.out.parent)
        self.published = True


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
