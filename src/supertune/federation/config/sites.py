"""Each site's run config: resolved once from the site's YAML and overrides when the federation is
created (kept as <federation dir>/sites/<name>.yaml), then per round with the settings the
federation decides (the global model to start from, the steps, the data order, the checkpoint).

A site's own settings stay its own: data, strategy, batch sizes, learning rate, precision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ...config.errors import ConfigError
from ...config.load import dump_config
from ...config.schema import RunConfig
from ...resolve import Resolution, resolve
from .schema import FederationConfig, SiteConfig

__all__ = [
    "SitePlan",
    "resolve_sites",
    "round_overrides",
    "round_resolution",
    "schedule_warning",
    "base_overrides",
    "STRATEGIES_WITH_OWN_OPTIMIZER",
]

log = logging.getLogger("supertune")

# Their optimizer state is DeepSpeed's own partitioned format, not a torch optimizer's state dict.
STRATEGIES_WITH_OWN_OPTIMIZER = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class SitePlan:
    """A site and its resolved base run config (before the per-round settings)."""

    site: SiteConfig
    config: RunConfig
    text: str
    """The resolved config as YAML: what <federation dir>/sites/<name>.yaml holds."""


def resolve_sites(fed: FederationConfig) -> list[SitePlan]:
    """Every site's run config, checked with the settings of round 1; one ConfigError for all sites."""
    problems: list[str] = []
    plans = []
    for i, site in enumerate(fed.sites):
        where = f"sites[{i}] ({site.name})"
        try:
            # A site reached over SSH keeps its files there: checked where they are when its first round starts.
            # A site agent's config and files are at its site: the coordinator knows its overrides only.
            agents = fed.executor == "agents"
            res = resolve(
                None if agents else site.config,
                [*site.overrides, *base_overrides(fed, site, here=not agents)],
                files_here=not (site.login or agents),
            )
        except ConfigError as exc:
            problems += [f"{where}: {p}" for p in exc.problems]
            continue
        problems += [f"{where}: {p}" for p in _site_problems(fed, site, res.config)]
        plans.append(SitePlan(site, res.config, dump_config(res.config)))
    if not problems:
        from .lora_modes import lora_problems

        problems += lora_problems(fed, [p.site.name for p in plans], [p.config for p in plans])
    if problems:
        raise ConfigError(problems)
    for plan in plans:
        warning = schedule_warning(plan.site, plan.config)
        if warning:
            log.warning("%s", warning)
    return plans


def schedule_warning(site: SiteConfig, cfg: RunConfig) -> str | None:
    """Each round is a new run, so its learning-rate schedule starts again: warmup from 0 up to
    training.learning_rate, then the decay, within the round's steps. A warmup of steps_per_round
    steps or more never reaches the configured peak; said once per site when the federation starts."""
    t, steps = cfg.training, site.steps_per_round
    if t.warmup_steps < 1 or t.warmup_steps < steps or t.lr_scheduler_type == "constant":
        return None  # a fraction of the round's steps, or a warmup that ends within the round
    peak = t.learning_rate * (steps - 1) / t.warmup_steps  # the linear warmup's value at the round's last step
    return (
        f"site {site.name}: training.warmup_steps={t.warmup_steps:g} is not below steps_per_round={steps}, and every "
        f"round restarts the schedule (each round is a new run): the learning rate never reaches "
        f"training.learning_rate={t.learning_rate:g} (at most {peak:.3g}); set training.warmup_steps below "
        f"{steps}, e.g. a fraction of the round such as 0.1"
    )


def base_overrides(fed: FederationConfig, site: SiteConfig, here: bool = True) -> list[str]:
    """What the federation sets for every round, checked once here with round 1's global model (the base).
    `here`: the site's cluster profile is one of this machine's (not an agent's, at its site)."""
    import yaml

    overrides = ["model.from_config=false", f"launch.cluster={site.where if here else 'local'}"]
    if fed.base_model:
        overrides.append(f"model.name_or_path={fed.base_model}")
        overrides.append("model.config_overrides=")
    else:
        overrides.append("model.name_or_path=")
        flow = yaml.safe_dump(fed.base_config_overrides, default_flow_style=True, width=10**6).strip()
        overrides.append(f"model.config_overrides={flow if fed.base_config_overrides else ''}")
    return overrides


def _site_problems(fed: FederationConfig, site: SiteConfig, cfg: RunConfig) -> list[str]:
    p = []
    # An fsdp site's checkpoints are every rank's shards: the average reads them a tensor at a time
    # (averaging.sharded_input); its optimizer state is DCP's, which init_optimizer_from does not read.
    if fed.optimizer_state == "kept" and cfg.distributed.strategy in STRATEGIES_WITH_OWN_OPTIMIZER + ("fsdp",):
        p.append(
            f"optimizer_state: kept carries a torch optimizer's state between rounds, which distributed.strategy="
            f"{cfg.distributed.strategy} does not save as one; use optimizer_state: fresh or distributed.strategy=ddp"
        )
    if cfg.data.streaming and cfg.data.store is None:
        p.append(
            "data.streaming: each round reads the site's data from a new seed; a stream cannot be reordered that way, use files or a token store"
        )
    return p


def round_overrides(
    fed: FederationConfig, plan: SitePlan, number: int, global_model: Path, previous_checkpoint: Path | None
) -> list[str]:
    """The settings the federation decides for a site's run in round `number` (1-based)."""
    site, t = plan.site, plan.config.training
    data_seed = (t.data_seed if t.data_seed is not None else t.seed) + number - 1
    save_steps = min(t.save_steps, site.steps_per_round)
    overrides = [
        f"model.name_or_path={global_model}",
        "model.from_config=false",
        "model.config_overrides=",
        f"training.max_steps={site.steps_per_round}",
        f"training.data_seed={data_seed}",
        "training.save_strategy=steps",
        f"training.save_steps={save_steps}",
        f"output.name={fed.name}-{site.name}-r{number:03d}",
    ]
    if previous_checkpoint is not None:
        overrides.append(f"training.init_optimizer_from={previous_checkpoint}")
    return overrides


def round_resolution(plan_file: Path, overrides: list[str], files_here: bool = True) -> Resolution:
    """The site's run config for one round: its resolved base config file with the round's settings."""
    return resolve(plan_file, overrides, files_here=files_here)
