"""Whether a federation's sites train LoRA adapters, in which mode (aggregation.lora), and the
settings refused with them: read from the sites' resolved run configs (rounds/lora.py says what the modes do)."""

from __future__ import annotations

from ...config.schema import RunConfig
from .schema import FederationConfig

__all__ = ["lora_sites", "lora_problems"]


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
    if enabled and fed.privacy.active:
        return [
            "model.lora.enabled: LoRA sites are not supported with privacy yet; train the whole model, or leave privacy out"
        ]
    if enabled and fed.mode == "buffered":
        return [
            "model.lora.enabled: LoRA sites are not supported with mode: buffered yet; train the whole model, "
            "or use mode: synchronous"
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
