"""The run config against the model's own sizes, when they can be read without loading anything: a
local model directory's config.json, with model.config_overrides over it when the model is built
from its config.

Sequences longer than the model's positions and LoRA ranks above its width fail only once the model
is built (an index error at the first batch, a device-side assert on a GPU, an allocation of
r x width per layer); here they are one line before a run directory exists. A hub id is not read:
the same checks run again on the built model (supertune.training_data.pipeline, supertune.modeling.lora).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..config.schema import RunConfig

__all__ = ["model_fit_problems"]

_POSITIONS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_fit_problems(cfg: RunConfig) -> list[str]:
    """One line per value that the model's sizes cannot take; empty when they fit or are unknown."""
    values = _model_values(cfg)
    if values is None:
        return []
    p: list[str] = []
    d = cfg.data
    positions = next(
        (values[k] for k in _POSITIONS if isinstance(values.get(k), int) and not isinstance(values.get(k), bool)), None
    )
    key, length = ("data.block_size", d.block_size) if d.packing else ("data.max_length", d.max_length)
    if positions is not None and length is not None and 0 < positions < length:
        p.append(
            f"{key}: {length} tokens per sequence, but the model has {positions} positions; use at most {positions}, "
            "or build the model with more (model.config_overrides=max_position_embeddings=N, with fresh weights)"
        )
    width = values.get("hidden_size", values.get("n_embd", values.get("d_model")))
    lora = cfg.model.lora
    if lora.enabled and isinstance(width, int) and 0 < width < lora.r:
        p.append(
            f"model.lora.r: {lora.r} is above the model's width ({width}); a LoRA rank is at most that, usually 4 to 64"
        )
    return p


def _model_values(cfg: RunConfig) -> dict[str, Any] | None:
    """The model config's plain values with the overrides applied, or None when they cannot be read cheaply."""
    m = cfg.model
    if m.bundle is not None:
        return None  # the bundle's config is checked with the store's manifest when it is opened
    if m.name_or_path is None:
        # The embedded tiny Llama: its sizes are plain numbers (supertune.embedded.model imports nothing).
        from ..embedded.model import default_model_config

        return {
            **default_model_config(vocab_size=0, bos_token_id=0, eos_token_id=0, pad_token_id=0),
            **m.config_overrides,
        }
    path = os.path.join(os.path.expanduser(m.name_or_path), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError):
        return None  # a hub id, or a config.json that validation reports by itself
    if not isinstance(values, dict):
        return None
    return {**values, **m.config_overrides} if m.from_config else values
