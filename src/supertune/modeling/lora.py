"""LoRA adapters through peft: which weights train, and how the result is saved."""

from __future__ import annotations

from typing import Any

from ..config.schema import LoraConfig
from ..errors import UserError

__all__ = ["add_lora"]


def add_lora(model: Any, lora: LoraConfig) -> Any:
    """Wrap `model` so that only adapter weights train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets: Any = "all-linear" if lora.target_modules == ["all-linear"] else lora.target_modules
    config = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m.__class__.__name__ == "Linear"})
        raise UserError(
            f"model.lora.target_modules: {lora.target_modules} match nothing in this model ({str(exc).splitlines()[0]}); "
            f"its linear layers are {', '.join(names)}"
        ) from None
