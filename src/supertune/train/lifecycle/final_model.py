"""Saving the trained model in plain Hugging Face format (safetensors), LoRA merged or as adapters."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ...checkpoints.manifest import write_model_manifest
from ...config.schema import RunConfig
from ...launch.environment import LaunchEnvironment
from ...modeling.model import torch_dtype
from ...rundir import RunDir
from .output_dtype import cast_saved_model

__all__ = ["save_final_model"]


def save_final_model(trainer: Any, tokenizer: Any, cfg: RunConfig, run: RunDir, env: LaunchEnvironment) -> None:
    """Write <run dir>/model so that AutoModelForCausalLM.from_pretrained loads it with no supertune import."""
    if not cfg.output.save_model:
        return
    lora = cfg.model.lora
    # Merging adapters and saving a fresh base read every weight on the main process alone: true
    # under ddp, zero1 and zero2; zero3 and fsdp shard the weights, and config validation refuses
    # both there (supertune.distributed.checks).
    if lora.enabled and lora.merge_on_save:
        if env.is_main:
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.to(torch_dtype(cfg.model.dtype)).save_pretrained(run.model)
            tokenizer.save_pretrained(run.model)
            _finish(run.model, cfg.output.dtype)
        trainer.accelerator.wait_for_everyone()
        return
    if cfg.distributed.strategy == "fsdp":
        _save_fsdp(trainer, tokenizer, run, env)
        if env.is_main:
            _finish(run.model, cfg.output.dtype)
        trainer.accelerator.wait_for_everyone()
        return
    # save_model gathers sharded weights (ZeRO-3: stage3_gather_16bit_weights_on_model_save; FSDP: a
    # full state dict) into one checkpoint written by the main process; every rank must call it.
    trainer.save_model(str(run.model))
    if env.is_main:
        if lora.enabled and (cfg.model.name_or_path is None or cfg.model.from_config):
            _save_fresh_base(trainer, run, cfg.output.dtype)  # also points the adapters' config at it
        _finish(run.model, cfg.output.dtype)
    trainer.accelerator.wait_for_everyone()


def _save_fsdp(trainer: Any, tokenizer: Any, run: RunDir, env: LaunchEnvironment) -> None:
    """One full state dict gathered from the FSDP shards into rank 0's CPU memory (every rank takes
    part; the others get an empty dict), saved as a plain Hugging Face checkpoint (LoRA: the adapters).

    Costs one full copy of the weights in rank 0's CPU memory for the moment of the save, as ZeRO-3's.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = trainer.model
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        _share_tied(model, state)
        model.save_pretrained(run.model, state_dict=state)
        tokenizer.save_pretrained(run.model)


def _share_tied(model: Any, state: dict[str, Any]) -> None:
    """Names of one parameter (tied embeddings) gathered as separate copies point at one tensor again,
    so that save_pretrained writes it once, as it does for an unsharded model."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in state:
            source = first.setdefault(id(param), name)
            state[name] = state[source]


def _finish(model_dir: Path, dtype: str) -> None:
    """output.dtype applied (LoRA adapters are left as they are), then, once every file is final, the
    sizes and sha256 that eval, generate, averaging and a run starting from this model check (hashing
    reads the model once more: about 1 s per GB)."""
    cast_saved_model(model_dir, dtype)
    write_model_manifest(model_dir)


def _save_fresh_base(trainer: Any, run: RunDir, dtype: str) -> None:
    """Adapters on freshly initialised weights need those weights too: save them beside the adapters.

    Costs one copy of the base model in memory for the moment of the save; only fresh-weight LoRA
    runs (an unusual choice) pay it.
    """
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    base = copy.deepcopy(peft_model).unload()
    base_dir = run.base_model
    base.save_pretrained(base_dir)
    _finish(base_dir, dtype)
    config_path = run.model / "adapter_config.json"
    adapter = json.loads(config_path.read_text())
    adapter["base_model_name_or_path"] = str(base_dir)
    config_path.write_text(json.dumps(adapter, indent=2) + "\n")
