"""Checks of a run config that need more than the config: the cluster profile it runs on, the model's
own config, DeepSpeed's config classes. Each problem is one line naming the key and the fix.

They run after the config's own validation passed (a config with a wrong type is not worth
importing DeepSpeed for), in every command that creates a run and in every training process.
"""

from __future__ import annotations

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig

__all__ = ["site_problems", "bundle_problems", "deep_problems"]


def site_problems(cfg: RunConfig, profile: ClusterProfile | None) -> list[str]:
    """What the site cannot do that the config asks for (the profile's hardware facts)."""
    if profile is None:
        return []
    problems: list[str] = []
    t, name = cfg.training, profile.name
    gpus = cfg.launch.gpus_per_node if cfg.launch.gpus_per_node is not None else profile.gpus_per_node
    if gpus > 0 and not profile.gpu_bf16:
        model = profile.gpu_model or "GPUs"
        if t.bf16:
            problems.append(f"training.bf16: the {model} of cluster {name} have no bf16; use training.fp16=true (mixed precision) or fp32")
        if cfg.model.dtype == "bf16":
            problems.append(f"model.dtype: the {model} of cluster {name} have no bf16; use fp16 or fp32")
    return problems


def bundle_problems(cfg: RunConfig) -> list[str]:
    """model.bundle names a store with the offline bundle this run needs (a look at its files)."""
    from ..store.bundle import bundle_problem

    m = cfg.model
    if m.bundle is None:
        return []
    problem = bundle_problem(m.bundle, model_config=m.from_config and m.name_or_path is not None)
    return [problem] if problem else []


def deep_problems(cfg: RunConfig) -> list[str]:
    """model.config_overrides against the model's own config, and the sharding strategy (DeepSpeed's
    own checks): each may import transformers or DeepSpeed, so only a config sound otherwise gets them."""
    from ..distributed.checks import strategy_problems
    from ..modeling.model import config_override_problems, document_mask_problems

    return config_override_problems(cfg.model) + document_mask_problems(cfg.model, cfg.data) + strategy_problems(cfg)
