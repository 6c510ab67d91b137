"""Build the model a run trains: pretrained weights, a config with fresh weights, or the embedded tiny Llama."""

from __future__ import annotations

import os
from typing import Any

from ..checkpoints.model_files import check_saved_model, model_config_problems
from ..config.schema import DataConfig, ModelConfig
from ..errors import UserError, first_line
from ..hub import resolve_reference
from .checkpointing import enable_checkpointing
from .lora import add_lora, continue_lora, saved_adapters
from .packed_attention import keep_packed_rows_apart, packed_rows_problem
from .tokenizer import token_id_limit

__all__ = [
    "build_model",
    "torch_dtype",
    "context_length",
    "config_override_problems",
    "document_mask_problems",
]


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def build_model(m: ModelConfig, tokenizer: Any, document_mask: bool = False) -> Any:
    """The model, sized to the tokenizer, with gradient checkpointing (all layers or every Nth) and LoRA applied as configured.

    document_mask (data.document_mask): with no attention kernel chosen, packed rows use flash
    attention's variable-length kernel on a GPU where its package is installed, else SDPA with the
    block-diagonal mask transformers builds from the position ids."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from .load_errors import model_load_errors

    if not m.low_cpu_mem_usage and int(transformers.__version__.split(".")[0]) >= 5:
        raise UserError("model.low_cpu_mem_usage: transformers 5 always loads weights in place; set it to true")
    dtype = torch_dtype(m.dtype)
    common: dict[str, Any] = {"dtype": dtype}
    if m.attn_implementation:
        common["attn_implementation"] = m.attn_implementation
    elif document_mask and _flash_attention_here():
        common["attn_implementation"] = "flash_attention_2"
    adapters = saved_adapters(m.name_or_path) if m.name_or_path and not m.from_config else None
    if adapters is not None:
        model = _load_adapter_base(m, adapters, common)
    elif m.name_or_path is None:
        config = _default_config(tokenizer, m.config_overrides)
        model = AutoModelForCausalLM.from_config(config, **common)
    else:
        ref, hub = _model_source(m)
        if not m.from_config:
            check_saved_model(ref, "model.name_or_path", "auto", tokenizer=False)
        with model_load_errors("model.name_or_path", ref):
            if m.from_config:
                config = AutoConfig.from_pretrained(ref, **hub)
                _apply_overrides(config, m.config_overrides)
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=m.trust_remote_code, **common)
            else:
                model = AutoModelForCausalLM.from_pretrained(ref, **hub, **common)
    _fit_vocabulary(model, tokenizer)
    keep_packed_rows_apart(model)  # document-masked rows (data.document_mask): refuse, or keep them apart
    if m.gradient_checkpointing:
        enable_checkpointing(model, m.gradient_checkpointing_every)
    if m.lora.enabled:
        if m.gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings would otherwise cut the graph
        model = add_lora(model, m.lora) if adapters is None else continue_lora(model, m.name_or_path, adapters, m.lora)
    return model


def _load_adapter_base(m: ModelConfig, adapters: dict[str, Any], common: dict[str, Any]) -> Any:
    """The base model saved LoRA adapters name (their adapter_config.json), loaded to train the adapters further."""
    from transformers import AutoModelForCausalLM

    from .load_errors import model_load_errors

    if not m.lora.enabled:
        raise UserError(
            f"model.name_or_path: {m.name_or_path!r} holds LoRA adapters; set model.lora.enabled=true to train them further, "
            "or merge them into their base first"
        )
    base = adapters.get("base_model_name_or_path")
    if not base or not os.path.isdir(base):
        raise UserError(
            f"model.name_or_path: the adapters in {m.name_or_path!r} name base model {base!r}, which is not a directory "
            "here; fix base_model_name_or_path in their adapter_config.json"
        )
    check_saved_model(base, "model.name_or_path (the adapters' base)", "auto", tokenizer=False)
    with model_load_errors("model.name_or_path", base):
        return AutoModelForCausalLM.from_pretrained(base, local_files_only=True, **common)


def _flash_attention_here() -> bool:
    """A CUDA GPU and the flash-attn package: what transformers' flash_attention_2 needs (not tried on ROCm)."""
    import importlib.util

    import torch

    return (
        torch.cuda.is_available() and torch.version.hip is None and importlib.util.find_spec("flash_attn") is not None
    )


def _model_source(m: ModelConfig) -> tuple[str, dict[str, Any]]:
    """Where name_or_path's config (and weights) are read from, with the loading options: a model
    built from its config with model.bundle reads the config the store's offline bundle saved."""
    if m.bundle and m.from_config:
        from .bundle import bundle_model_config

        return bundle_model_config(m.bundle), {"local_files_only": True, "trust_remote_code": m.trust_remote_code}
    r = resolve_reference(m.name_or_path, "model.name_or_path", "config.json", m.revision)
    return r.ref, {
        "local_files_only": r.local_files_only,
        "revision": m.revision,
        "trust_remote_code": m.trust_remote_code,
    }


def context_length(model: Any) -> int:
    """Longest sequence the model's positions allow (2048 when the config does not say)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "max_position_embeddings", None) or 2048)


def _default_config(tokenizer: Any, overrides: dict[str, Any]) -> Any:
    from transformers import LlamaConfig

    from ..embedded import default_model_config

    kwargs = default_model_config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlamaConfig(**kwargs)
    _apply_overrides(config, overrides)
    return config


def config_override_problems(m: ModelConfig) -> list[str]:
    """What is wrong with model.config_overrides for the model config they would change (empty: nothing).

    Run with config validation, before a run directory exists. It reads the model's config.json (a
    local directory, the local hub cache or the store's bundle) but builds no model; importing
    transformers' config classes costs about 2 s (they import torch), paid only when overrides are set.
    """
    if not m.config_overrides or (m.name_or_path is not None and not m.from_config):
        return []  # validation refuses overrides on pretrained weights by itself
    if m.name_or_path is None:
        from transformers import LlamaConfig

        config = LlamaConfig()
    else:
        from transformers import AutoConfig

        ref, hub = _model_source(m)
        try:
            config = AutoConfig.from_pretrained(ref, **hub)
        except (OSError, ValueError) as exc:
            return [f"model.name_or_path: cannot read the config of {ref!r}: {first_line(exc)}"]
    problem = _override_problem(config, m.config_overrides)
    if problem:
        return [problem]
    values = config.to_dict()
    if m.name_or_path is None:
        from ..embedded import default_model_config

        values.update(default_model_config(vocab_size=1, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    return [f"model.config_overrides: {p}" for p in model_config_problems({**values, **m.config_overrides})]


def document_mask_problems(m: ModelConfig, d: DataConfig) -> list[str]:
    """data.document_mask against the model's type (from its config.json) and model.attn_implementation,
    before anything is loaded: one line per problem, empty when the model keeps packed documents apart.

    The same check runs again on the built model at its first document-masked forward
    (supertune.modeling.packed_attention), with the attention transformers actually chose. A
    config that cannot be read is left to the model loading, which says why.
    """
    if not (d.document_mask and d.packing):
        return []
    model_type = "llama"  # the embedded default
    if m.name_or_path is not None:
        from transformers import AutoConfig

        try:
            ref, hub = _model_source(m)
            model_type = AutoConfig.from_pretrained(ref, **hub).model_type
        except (OSError, ValueError, UserError):
            return []
    problem = packed_rows_problem(model_type, m.attn_implementation)
    return [problem] if problem else []


def _override_problem(config: Any, overrides: dict[str, Any]) -> str | None:
    known = set(config.to_dict())
    unknown = [k for k in overrides if k not in known]
    if not unknown:
        return None
    import difflib

    hints = [difflib.get_close_matches(k, known, n=1) for k in unknown]
    said = ", ".join(f"{k!r}" + (f" (did you mean {h[0]}?)" if h else "") for k, h in zip(unknown, hints))
    return f"model.config_overrides: {said} not a field of {type(config).__name__}"


def _apply_overrides(config: Any, overrides: dict[str, Any]) -> None:
    problem = _override_problem(config, overrides)
    if problem:
        raise UserError(problem)
    derived_head_dim = _head_dim_is_derived(config)
    for key, value in overrides.items():
        setattr(config, key, value)
    # A config computes head_dim = hidden_size / num_attention_heads when it is built, and setting
    # either afterwards leaves the old value: hidden_size=2048 with 16 heads over the embedded
    # default's head_dim of 32 built attention projections of 512 instead of 2048 (a "1 B" Llama of
    # 779 M parameters). Derived before, derived again; a head_dim the config states stays.
    if derived_head_dim and "head_dim" not in overrides:
        config.head_dim = config.hidden_size // config.num_attention_heads


def _head_dim_is_derived(config: Any) -> bool:
    head_dim = getattr(config, "head_dim", None)
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if not (isinstance(head_dim, int) and isinstance(hidden, int) and isinstance(heads, int) and heads > 0):
        return False
    return head_dim == hidden // heads


def _fit_vocabulary(model: Any, tokenizer: Any) -> None:
    """Grow the embeddings when the tokenizer knows more tokens than the model (added special tokens).

    Sized by the largest id, not the count: a vocabulary with gaps in its ids has fewer entries than
    its largest id, and an id beyond the embedding rows is an index error on the CPU and a
    device-side assert on a GPU, at the first batch that holds it.
    """
    size = model.get_input_embeddings().weight.shape[0]
    needed = token_id_limit(tokenizer)
    if needed > size:
        model.resize_token_embeddings(needed)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name)
        if getattr(model.config, name, None) is None and value is not None:
            setattr(model.config, name, value)
    generation = getattr(model, "generation_config", None)
    if generation is not None and generation.pad_token_id is None:
        generation.pad_token_id = tokenizer.pad_token_id
