"""LoRA adapters through peft: which weights train, and how the result is saved."""

from __future__ import annotations

from typing import Any

from ..config.schema import LoraConfig
from ..errors import UserError, first_line

__all__ = ["add_lora", "continue_lora", "saved_adapters", "adapter_differences"]


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


def saved_adapters(directory: str) -> dict[str, Any] | None:
    """The adapter_config.json of a local directory of saved LoRA adapters (and no full model), else None."""
    import json
    import os

    path = os.path.join(os.path.expanduser(directory), "adapter_config.json")
    if not os.path.isfile(path) or os.path.isfile(os.path.join(os.path.expanduser(directory), "config.json")):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"model.name_or_path: {path} is not readable JSON ({first_line(exc)}); save the adapters again"
        ) from None
    return values if isinstance(values, dict) else None


def adapter_differences(saved: dict[str, Any], lora: LoraConfig) -> list[str]:
    """Where saved adapters' settings differ from model.lora's: the shape of their tensors and their scale."""
    targets = saved.get("target_modules")
    targets = sorted(targets) if isinstance(targets, list) else targets
    wanted = "all-linear" if lora.target_modules == ["all-linear"] else sorted(lora.target_modules)
    out = []
    for key, have, want in (("r", saved.get("r"), lora.r), ("alpha", saved.get("lora_alpha"), lora.alpha)):
        if have != want:
            out.append(f"model.lora.{key}={want} but the saved adapters have {have}")
    # peft expands all-linear into the module names when it saves: only explicit lists are compared
    if wanted != "all-linear" and isinstance(targets, list) and targets != wanted:
        out.append(f"model.lora.target_modules={wanted} but the saved adapters adapt {targets}")
    return out


def continue_lora(model: Any, directory: str, saved: dict[str, Any], lora: LoraConfig) -> Any:
    """Wrap `model` (the adapters' base) with saved adapters, trainable; their settings must be model.lora's."""
    import os

    from peft import PeftModel

    differences = adapter_differences(saved, lora)
    if differences:
        raise UserError(
            f"model.name_or_path: saved LoRA adapters: {'; '.join(differences)}; set model.lora like the adapters'"
        )
    return PeftModel.from_pretrained(model, os.path.expanduser(directory), is_trainable=True)
