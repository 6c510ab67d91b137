"""LoRA federations: sites train low-rank adapters on a frozen base, and only adapters move.

aggregation.lora decides what the round's global model is:

- adapters: the global adapter, the weighted average of the sites' A and B tensors (FedAvg of the
  adapter tensors). Every site continues training it from the next round on, on the same frozen
  base. Round 1 starts from one initial adapter made here (peft's initialisation, seeded with the
  federation's seed), so that every site's A starts equal: averaging the A of adapters that were
  initialised apart averages unrelated bases of the low-rank space. After the last round the global
  adapter is merged into the base (`FederationDir.merged`).
- merged: the global model is the previous one plus the weighted average of the sites' products
  s * B_i @ A_i (the average of the merged models, `supertune average --merge-first`), a full model.
  Every site starts a fresh adapter on it next round: the previous adapters are inside its weights.

The two differ because the average of products is not the product of averages: sum_i w_i B_i A_i
!= (sum_i w_i B_i)(sum_i w_i A_i). adapters moves only adapter bytes both ways; merged moves adapter
bytes up and the full model down to every site.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from ..config.schema import RunConfig
from .layout import FederationDir
from .schema import FederationConfig

__all__ = ["lora_sites", "lora_problems", "initial_adapter", "merge_final_adapter", "holds_adapters", "weight_bytes"]


def lora_sites(fed: FederationConfig, configs: list[RunConfig]) -> str | None:
    """The federation's LoRA mode (aggregation.lora) when its sites train adapters, else None."""
    return fed.aggregation.lora if configs and configs[0].model.lora.enabled else None


def lora_problems(fed: FederationConfig, names: list[str], configs: list[RunConfig]) -> list[str]:
    """Sites that cannot be averaged together: LoRA sites mixed with full-model sites, or adapters of
    other shapes or scales (r, alpha, target modules) than the first site's."""
    if not configs:
        return []
    first = configs[0].model.lora
    enabled = [n for n, c in zip(names, configs) if c.model.lora.enabled]
    if enabled and len(enabled) != len(names):
        full = [n for n in names if n not in enabled]
        return [
            f"model.lora.enabled: sites {', '.join(enabled)} train LoRA adapters and {', '.join(full)} the whole model; "
            "adapters and full models cannot be averaged together, set model.lora.enabled the same at every site"
        ]
    if not enabled:
        if fed.aggregation.lora == "merged":
            return [
                "aggregation.lora: merged averages LoRA adapters as merged models, and no site trains adapters; "
                "leave it out, or set model.lora.enabled=true at every site"
            ]
        return []
    p = []
    for i, (name, cfg) in enumerate(zip(names, configs)):
        lora = cfg.model.lora
        for key in ("r", "alpha", "target_modules"):
            if getattr(lora, key) != getattr(first, key):
                p.append(
                    f"sites[{i}] ({name}): model.lora.{key}={getattr(lora, key)} but site {names[0]} has {getattr(first, key)}; "
                    "adapters are averaged tensor by tensor, give every site the same model.lora.r, alpha and target_modules"
                )
    remote = [s.name for s in fed.sites if s.login and s.name in names]
    if fed.aggregation.lora == "adapters" and fed.executor == "agents":
        p.append(
            "aggregation.lora: adapters: the global adapter names its base by its path on the coordinator, which the "
            "sites' agents do not have; use aggregation.lora: merged, which sends them the full model"
        )
    elif fed.aggregation.lora == "adapters" and remote:
        p.append(
            f"aggregation.lora: adapters: the global adapter names its base by its path on this machine, which sites "
            f"{', '.join(remote)} (reached over SSH) do not have; use aggregation.lora: merged, which sends them the full model"
        )
    if fed.aggregation.lora == "merged" and fed.optimizer_state == "kept":
        p.append(
            "optimizer_state: kept carries a site's AdamW moments into the next round, and with aggregation.lora: merged "
            "every round trains a fresh adapter; use optimizer_state: fresh or aggregation.lora: adapters"
        )
    return p


def initial_adapter(fed: FederationConfig, cfg: RunConfig, base: Path, root: FederationDir) -> Path:
    """Round 1's global adapter (aggregation.lora: adapters): peft's initial adapter on the base, made
    once with the federation's seed and saved with the tokenizer; B is zero, so it is the base exactly."""
    target = root.round(0).path / "adapter"
    if target.is_dir():
        return target
    from transformers import set_seed

    from ..modeling.model import build_model
    from ..modeling.tokenizer import load_tokenizer

    model_cfg = replace(cfg.model, name_or_path=str(base.absolute()), from_config=False, config_overrides={})
    tokenizer = load_tokenizer(replace(cfg, model=model_cfg))
    set_seed(fed.seed)
    model = build_model(replace(model_cfg, gradient_checkpointing=False), tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".adapter.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # published complete, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def merge_final_adapter(fed: FederationConfig, base: Path, root: FederationDir) -> Path | None:
    """The last round's global adapter merged into the base: a full model that loads without peft
    (`FederationDir.merged`); None before the last round is averaged. Made once, published by a rename."""
    from ..averaging import average_checkpoints
    from .receipts import read_receipt

    last = root.round(fed.rounds)
    if read_receipt(last.averaged) is None:
        return None
    if not root.merged.is_dir():
        average_checkpoints([last.global_model], root.merged, weights="uniform", merge_base=base, minimum_inputs=1)
    return root.merged


def holds_adapters(directory: Path) -> bool:
    """Whether a site's checkpoint (or the transfer package it sent) holds LoRA adapters, not a model."""
    from ..averaging.inputs import ADAPTER_CONFIG
    from ..transfer import PACKAGE_MANIFEST, read_package

    if (directory / PACKAGE_MANIFEST).is_file():
        return ADAPTER_CONFIG in read_package(directory).files
    return (directory / "adapter_model.safetensors").is_file()


def weight_bytes(directory: str | Path) -> int:
    """Bytes of the weights a site sends (its checkpoint's adapters, or its model's safetensors, or the
    transfer package it sent), not its optimizer state."""
    from ..transfer import PACKAGE_MANIFEST, read_package

    path = Path(directory)
    if (path / PACKAGE_MANIFEST).is_file():
        return read_package(path).sent_weight_bytes
    adapters = path / "adapter_model.safetensors"
    if adapters.is_file():
        return adapters.stat().st_size
    return sum(f.stat().st_size for f in path.glob("model*.safetensors"))
