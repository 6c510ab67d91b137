"""What a site's model or adapter directory holds: adapters or a full model, and its weights' bytes (a
transfer package's as sent)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["holds_adapters", "weight_bytes"]


def holds_adapters(directory: Path) -> bool:
    """Whether a site's checkpoint (or the transfer package it sent) holds LoRA adapters, not a model."""
    from ...averaging.inputs import ADAPTER_CONFIG
    from ...transfer import PACKAGE_MANIFEST, read_package

    if (directory / PACKAGE_MANIFEST).is_file():
        return ADAPTER_CONFIG in read_package(directory).files
    return (directory / "adapter_model.safetensors").is_file()


def weight_bytes(directory: str | Path) -> int:
    """Bytes of the weights a site sends (its checkpoint's adapters, or its model's safetensors, or the
    transfer package it sent), not its optimizer state."""
    from ...transfer import PACKAGE_MANIFEST, read_package

    path = Path(directory)
    if (path / PACKAGE_MANIFEST).is_file():
        return read_package(path).sent_weight_bytes
    adapters = path / "adapter_model.safetensors"
    if adapters.is_file():
        return adapters.stat().st_size
    return sum(f.stat().st_size for f in path.glob("model*.safetensors"))
