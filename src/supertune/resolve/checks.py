"""Checks of a run config that need more than the config: the cluster profile it runs on, the files
of a local model or tokenizer, the model's own config, DeepSpeed's config classes. Each problem is one
line naming the key and the fix.

They run after the config's own validation passed (a config with a wrong type is not worth
importing DeepSpeed for), in every command that creates a run and in every training process.
"""

from __future__ import annotations

import os

from ..clusters.schema import ClusterProfile
from ..config.schema import RunConfig

__all__ = ["site_problems", "model_file_problems", "bundle_problems", "deep_problems"]


def site_problems(cfg: RunConfig, profile: ClusterProfile | None) -> list[str]:
    """What the site cannot do that the config asks for (the profile's hardware facts)."""
    if profile is None:
        return []
    problems: list[str] = []
    t, name = cfg.training, profile.name
    gpus = cfg.launch.gpus_per_node if cfg.launch.gpus_per_node is not None else profile.gpus_per_node
    if gpus > 0 and gpus * profile.cpus_per_gpu > profile.cpus_per_node:
        source = "launch.gpus_per_node" if cfg.launch.gpus_per_node is not None else f"cluster {name}'s gpus_per_node"
        problems.append(
            f"{source}: {gpus} GPUs with {profile.cpus_per_gpu} cores each (cpus_per_gpu) need {gpus * profile.cpus_per_gpu} "
            f"cores, more than the {profile.cpus_per_node} of a node of cluster {name} (cpus_per_node), so Slurm would never "
            "start the job; use fewer GPUs per node, or set cpus_per_gpu and cpus_per_node to the nodes' own in your profile"
        )
    if gpus > 0 and not profile.gpu_bf16:
        model = profile.gpu_model or "GPUs"
        if t.bf16:
            problems.append(
                f"training.bf16: the {model} of cluster {name} have no bf16; use training.fp16=true (mixed precision) or fp32"
            )
        if cfg.model.dtype == "bf16":
            problems.append(f"model.dtype: the {model} of cluster {name} have no bf16; use fp16 or fp32")
    return problems


def model_file_problems(cfg: RunConfig) -> list[str]:
    """A local model or tokenizer directory's files, read as far as their headers
    (checkpoints.model_files): a damaged one is refused before a run directory exists, rather than by
    a loader's traceback. A directory that does not exist is the config's own check."""
    from ..checkpoints.model_files import NO_TOKENIZER, has_tokenizer_files, model_dir_problems

    m, p = cfg.model, []
    from_bundle = m.bundle is not None and m.from_config  # the bundle's config stands in for name_or_path's
    model_dir = os.path.expanduser(m.name_or_path) if m.name_or_path and not from_bundle else None
    saved = ("config.json", "adapter_config.json")  # a model, or LoRA adapters that name their base
    if model_dir and os.path.isdir(model_dir) and not any(os.path.isfile(os.path.join(model_dir, f)) for f in saved):
        p.append(
            f"model.name_or_path: {m.name_or_path!r} holds no config.json, so it is not a saved model; give the directory a model was saved to"
        )
    elif model_dir and os.path.isdir(model_dir):
        damage = model_dir_problems(model_dir, weights=not m.from_config)
        if damage:
            more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
            p.append(
                f"model.name_or_path: {m.name_or_path!r} is damaged: {damage[0]}{more}; save or copy the model again"
            )
        if m.tokenizer is None and m.bundle is None and not has_tokenizer_files(model_dir):
            p.append(
                f"model.name_or_path: {m.name_or_path!r} {NO_TOKENIZER}; set model.tokenizer to the directory of the tokenizer its weights were trained with"
            )
    tokenizer_dir = os.path.expanduser(m.tokenizer) if m.tokenizer not in (None, "train") else None
    if tokenizer_dir and os.path.isdir(tokenizer_dir) and not has_tokenizer_files(tokenizer_dir):
        p.append(
            f"model.tokenizer: {m.tokenizer!r} {NO_TOKENIZER}; give the directory a tokenizer was saved to (tokenizer.json)"
        )
    return p


def bundle_problems(cfg: RunConfig) -> list[str]:
    """model.bundle names a store with the offline bundle this run needs (a look at its files)."""
    from ..modeling.bundle import bundle_problem

    m = cfg.model
    if m.bundle is None:
        return []
    problem = bundle_problem(m.bundle, model_config=m.from_config and m.name_or_path is not None)
    return [problem] if problem else []


def deep_problems(cfg: RunConfig, strategy: bool = True) -> list[str]:
    """model.config_overrides against the model's own config, and the sharding strategy (DeepSpeed's
    own checks; left out with strategy=False, for a command that trains nothing): each may import
    transformers or DeepSpeed, so only a config sound otherwise gets them."""
    from ..distributed.checks import strategy_problems
    from ..modeling.model import config_override_problems, document_mask_problems

    problems = config_override_problems(cfg.model) + document_mask_problems(cfg.model, cfg.data)
    return problems + (strategy_problems(cfg) if strategy else [])
