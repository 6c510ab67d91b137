"""supertune-average.json: what an average was made of and how, written last into its output."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .inputs import AVERAGE_MANIFEST

__all__ = ["AverageManifest", "FORMAT", "read_average_manifest", "write_average_manifest"]

FORMAT = 1


@dataclass
class AverageManifest:
    """The record of one average: inputs with their hashes and weights, the output's files and dtype."""

    kind: str
    """model (full weights averaged), adapter (LoRA tensors averaged) or merged (adapters merged into --base first)."""
    weights: str
    """How the weights were chosen: tokens, samples, uniform or explicit."""
    dtype: str
    """--dtype: same, bf16, fp16 or fp32."""
    inputs: list[dict[str, Any]]
    """Per input, in order: arg, directory, described, weight (normalised), raw_weight, tokens, tokens_source,
    samples, samples_source, files {name: {size, sha256}}."""
    tokens: int | None
    """Tokens seen by all inputs together (None when one input's is unknown): this output's weight in a later average."""
    samples: int | None
    tensors: int
    parameters: int
    """Elements of every tensor written."""
    tensor_dtypes: dict[str, int]
    """Output dtype -> number of tensors."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every output file but this manifest: {size, sha256}."""
    tokenizer_sha256: str | None = None
    notes: list[str] = field(default_factory=list)
    """Differences between the inputs that were allowed (config values that shape no tensor, ...)."""
    base: dict[str, Any] | None = None
    """--merge-first: the base model's directory and files."""
    server: dict[str, Any] | None = None
    """The server step: lr, momentum, the previous global model and its files, momentum_in and momentum_out with sha256."""
    seconds: float = 0.0
    format: int = FORMAT
    created_unix: float = field(default_factory=time.time)


def write_average_manifest(directory: Path, manifest: AverageManifest) -> Path:
    """Write the manifest, flushed to disk."""
    path = Path(directory) / AVERAGE_MANIFEST
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path


def read_average_manifest(directory: Path) -> AverageManifest:
    """The manifest of an average's output; ValueError when there is none or it is not of this format."""
    path = Path(directory) / AVERAGE_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{directory}: no {AVERAGE_MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not format {FORMAT}")
    known = set(AverageManifest.__dataclass_fields__)
    return AverageManifest(**{k: v for k, v in data.items() if k in known})
