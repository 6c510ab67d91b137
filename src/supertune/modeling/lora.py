"""LoRA adapters through peft: which weights train, and how the result is saved."""

from __future__ import annotations

from typing import Any

from ..config.schema import LoraConfig
from ..errors import UserError, first_line

__all__ = ["add_lora"]


def add_lora(model: Any, lora: LoraConfig) -> Any:
    """Wrap `model` so that only adapter weights train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets: Any = "all-linear" if lora.target_modules == ["all-linear"] else lora.target_modules
    _check_rank(model, lora)
    config = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m.__class__.__name__ == "Linear"})
        raise UserError(
            f"model.lora.target_modules: {lora.target_modules} match nothing in this model ({first_line(exc)}); "
            f"its linear layers are {', '.join(names)}"
        ) from None


def _check_rank(model: Any, lora: LoraConfig) -> None:
    """A rank above the narrowest adapted layer's width adds nothing, and a large one cannot even be
    allocated (two r x width matrices per layer): refused before peft builds the adapters."""
    every = lora.target_modules == ["all-linear"]
    widths = [
        min(m.in_features, m.out_features)
        for name, m in model.named_modules()
        if hasattr(m, "in_features")
        and hasattr(m, "out_features")
        and (every or name.rsplit(".", 1)[-1] in lora.target_modules)
    ]
    if widths and lora.r > min(widths):
        raise UserError(
            f"model.lora.r: {lora.r} is above the width of the narrowest adapted layer ({min(widths)}); "
            f"a LoRA rank is at most that, usually 4 to 64"
        )
