"""A federation as one tracked group: when its sites' run configs report to W&B or MLflow, every
site's run of every round and the federation's global series are tracked runs of one group.

- The round config of a site (sites.round_overrides' settings, then these) gets the group
  (`training.tracking_group`: the federation's name and id, W&B's run group and MLflow's tag
  supertune.group) and the project (`training.tracking_project`: the federation's name, unless the
  site's config names one); its tracked run is named after the round's output.name
  (`<federation>-<site>-rNNN`). A local site without an MLflow store of its own logs into the
  federation's (`<fed>/mlflow/mlflow.db`), so that MLflow holds the whole group in one place.
- The global series is a tracked run of the federation directory itself (`<fed>/tracking.json`,
  `<fed>/wandb`, `<fed>/mlflow`), named `<federation>-global`, logged by the federation's process after
  every round: the global model's loss on each site's validation data, their token-weighted mean,
  and the benchmarks' scores, at the round's number.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ...config.schema import RunConfig
from ...rundir import RunDir
from ...tracking.params import SINKS
from ..config.schema import FederationConfig
from ..config.sites import SitePlan
from ..state.layout import FederationDir
from ..state.receipts import read_receipt

__all__ = ["GlobalSeries", "group_name", "tracking_overrides"]


def group_name(fed: FederationConfig, identity: str) -> str:
    """The federation's name and the start of its id: two federations of one name stay two groups."""
    return f"{fed.name}-{identity[:8]}"


def _tracked(plan: SitePlan) -> bool:
    return any(s in SINKS for s in plan.config.training.report_to)


def tracking_overrides(fed: FederationConfig, plan: SitePlan, root: FederationDir, identity: str) -> list[str]:
    """The tracking settings of a site's round config; none when the site tracks nothing."""
    if not _tracked(plan):
        return []
    t = plan.config.training
    if not identity:
        from ..state.ownership import federation_id

        identity = federation_id(root)
    out = [f"training.tracking_group={group_name(fed, identity)}"]
    if not t.tracking_project:
        out.append(f"training.tracking_project={fed.name}")
    # A site reached over SSH has its own filesystem: its store stays its own run directory's.
    if "mlflow" in t.report_to and not t.mlflow_tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        if not plan.site.login:
            from ...tracking.mlflow_sink import default_tracking_uri

            out.append(f"training.mlflow_tracking_uri={default_tracking_uri(RunDir(root.path))}")
    return out


class GlobalSeries:
    """The federation's own tracked run; `log_round` after each round run here, `close` at the end.
    The tracked run starts with the first round logged: a finished federation run again opens nothing."""

    def __init__(self, cfg: RunConfig, fed: FederationConfig, root: FederationDir) -> None:
        self.cfg = cfg
        self.fed = fed
        self.root = root
        self.tracking: Any = None

    @classmethod
    def start(
        cls, fed: FederationConfig, plans: list[SitePlan], root: FederationDir, identity: str
    ) -> GlobalSeries | None:
        """None when no site tracks: the series follows the first tracked site's settings."""
        tracked = [p for p in plans if _tracked(p)]
        if not tracked:
            return None
        cfg = tracked[0].config
        training = dataclasses.replace(
            cfg.training,
            tracking_group=group_name(fed, identity),
            tracking_project=cfg.training.tracking_project or fed.name,
        )
        output = dataclasses.replace(cfg.output, name=f"{fed.name}-global")
        return cls(dataclasses.replace(cfg, training=training, output=output), fed, root)

    def log_round(self, number: int) -> None:
        from ...benchmarks.results import flat_scores

        rd = self.root.round(number)
        metrics: dict[str, float] = {}
        losses, tokens = [], []
        for site in self.fed.sites:
            evaluated = read_receipt(rd.site(site.name).evaluated) or {}
            if isinstance(evaluated.get("eval_loss"), int | float):
                metrics[f"global/{site.name}/eval_loss"] = evaluated["eval_loss"]
                losses.append(float(evaluated["eval_loss"]))
                tokens.append(float(evaluated.get("eval_tokens") or 1))
        if losses:
            metrics["global/eval_loss"] = sum(loss * n for loss, n in zip(losses, tokens, strict=True)) / sum(tokens)
        averaged = read_receipt(rd.averaged) or {}
        trained = averaged.get("tokens")
        if isinstance(trained, dict) and trained:
            metrics["global/tokens"] = sum(v for v in trained.values() if isinstance(v, int | float))
        metrics.update(flat_scores((read_receipt(rd.benchmarks) or {}).get("scores") or {}))
        if self.tracking is None:
            from ...launch.environment import launch_environment
            from ...tracking.session import Tracking

            self.tracking = Tracking.for_run(self.cfg, RunDir(self.root.path), launch_environment(), "federation")
        self.tracking.log(number, metrics)

    def close(self, outcome: str) -> None:
        if self.tracking is not None:
            self.tracking.close(outcome)
