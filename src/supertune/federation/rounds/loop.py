"""The rounds of a federation, each in three phases, resumable at the first unfinished one:

1. train: every site trains `steps_per_round` steps from the previous global model (its own run
   directory; a killed or stopped run resumes from its latest checkpoint);
2. average: the sites' final checkpoints, verified against their manifests, are averaged into the
   round's global model (token-weighted FedAvg, the optional server step);
3. evaluate: the new global model's loss on every site's validation data.

Round 0 evaluates the base model, so that every site has a loss before any training. Each finished
phase leaves a receipt (`layout`); no state is kept anywhere else, and nothing finished is redone.
What is left of a round goes to the executor as one `RoundWork`: the built-in executor runs its
phases one after another, StreamFlow as one workflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...config.load import dump_config
from ...errors import UserError
from ..config.schema import FederationConfig, SiteConfig
from ..config.sites import SitePlan, round_overrides, round_resolution
from ..reports.table import write_table
from ..state.history import first_unfinished_round, record_failure
from ..state.layout import FederationDir, RoundDir
from ..state.ownership import federation_id
from ..state.receipts import checked_global_model, read_receipt, write_receipt
from ..state.site_configs import keep_site_configs, site_config_file
from .base_model import base_model_dir
from .tracked import GlobalSeries, tracking_overrides

__all__ = ["Executor", "RoundWork", "SiteWork", "round_work", "run_rounds", "site_config_file", "site_training"]

log = logging.getLogger("supertune")


@dataclass(frozen=True)
class SiteWork:
    """One site's part of a phase: train in its run directory, or evaluate a global model."""

    site: SiteConfig
    round: int
    config: Path
    """train: the site's resolved run config of this round; evaluate: the site's base config (its data settings)."""
    directory: Path
    """The site's folder of this round (logs, receipts, the run)."""
    run: Path | None = None
    """train: the run directory."""
    receipt: Path | None = None

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def label(self) -> str:
        return f"{self.site.name} round {self.round}"


@dataclass
class RoundWork:
    """What is left of one round (round 0: only the base model's evaluation)."""

    number: int
    previous: Path
    """The global model this round starts from."""
    global_model: Path
    """The global model this round makes (round 0: the base)."""
    averaged: Path
    """The receipt of the average."""
    train: list[SiteWork] = field(default_factory=list)
    average: bool = False
    evaluate: list[SiteWork] = field(default_factory=list)
    trained: dict[str, Path] = field(default_factory=dict)
    """Receipt of every site's training (those of this work too, once done), in site order."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Sites left out of this round after failing (quorum.py), with the reason: from their receipts."""
    federation_id: str = ""
    """The federation's id (ownership.federation_id): a site's folder of the round must record it."""


class Executor(Protocol):
    def run_round(self, work: RoundWork) -> None:
        """Do the work, leaving its receipts; raise UserError naming the site (and its log) on a failure."""
        ...


def run_rounds(
    fed: FederationConfig,
    plans: list[SitePlan],
    root: FederationDir,
    executor: Executor,
    everyone: FederationConfig | None = None,
) -> None:
    """Every unfinished phase of every round, in order; the table and plot after each round.
    `fed` holds the sites that still work; `everyone` (default `fed`) every site the federation had,
    dropped ones too: the table keeps their rounds, and a failure is recorded against them."""
    everyone = everyone or fed
    keep_site_configs(root, {plan.site.name: plan.text for plan in plans})
    _check_last_global_model(fed, root)
    from ..config.lora_modes import lora_sites
    from .lora import initial_adapter, merge_final_adapter

    base = base_model_dir(fed, root)
    identity = federation_id(root)
    mode = lora_sites(fed, [p.config for p in plans])
    start = initial_adapter(fed, plans[0].config, base, root) if mode == "adapters" else base
    series = GlobalSeries.start(fed, plans, root, identity)
    for number in range(0, fed.rounds + 1):
        previous = start if number <= 1 else root.round(number - 1).global_model
        try:
            work = round_work(fed, plans, root, number, previous, base, identity)
            work.federation_id = identity
            fresh = bool(work.train or work.average or work.evaluate)
            if fresh:
                executor.run_round(work)
            if number and fed.benchmarks and read_receipt(root.round(number).benchmarks) is None:
                fresh = True
                benchmark_round(fed, root.round(number))
        except UserError as exc:
            record_failure(everyone, root, number, str(exc))  # --status shows it
            if series is not None:
                series.close("failed")
            raise
        if number:
            write_table(everyone, root)
            log.info("round %d of %d finished: %s", number, fed.rounds, root.table_markdown)
            if fed.privacy.active:
                from ..reports.epsilon import privacy_summary

                log.info("%s", privacy_summary(everyone, root))
            if series is not None and fresh:  # a resumed federation logged its finished rounds before
                series.log_round(number)
    if series is not None:
        series.close("finished")
    if mode == "adapters" and not root.merged.is_dir() and merge_final_adapter(fed, base, root) is not None:
        log.info("the last global adapter merged into the base model: %s", root.merged)


def _check_last_global_model(fed: FederationConfig, root: FederationDir) -> None:
    """The last averaged round's global model, which the next round starts from (or which is the
    finished federation's result), checked against its manifest; earlier ones may be deleted."""
    last = first_unfinished_round(fed, root)
    if read_receipt(root.round(last).averaged) is None:
        last -= 1
    if last >= 1:
        checked_global_model(root.round(last).averaged, last)


def benchmark_round(fed: FederationConfig, rd: RoundDir) -> None:
    """The federation's benchmarks on the round's global model, here (the model is in the federation
    directory); the receipt, written last, holds the scores the round table shows."""
    import time

    from ...benchmarks.saved_model import benchmark_saved_model
    from ...config.schema import EvaluationConfig

    started = time.time()
    scores, _, _ = benchmark_saved_model(
        str(rd.global_model), fed.benchmarks, EvaluationConfig(tasks=fed.benchmarks), option="benchmarks"
    )
    write_receipt(rd.benchmarks, {"scores": scores, "model": str(rd.global_model), "seconds": time.time() - started})


def round_work(
    fed: FederationConfig,
    plans: list[SitePlan],
    root: FederationDir,
    number: int,
    previous: Path,
    base: Path,
    identity: str = "",
) -> RoundWork:
    """identity: the federation's id (ownership.federation_id), read when a site's round config needs it."""
    rd = root.round(number)
    work = RoundWork(number, previous, base if number == 0 else rd.global_model, rd.averaged)
    for plan in plans:
        sd = rd.site(plan.site.name)
        if not plan.site.in_round(number):
            continue
        left_out = read_receipt(sd.left_out)
        if left_out is not None:  # failed every attempt and the round went on without it: a decision kept
            work.left_out[plan.site.name] = str(left_out.get("reason"))
            continue
        work.trained[plan.site.name] = sd.trained
        if number and read_receipt(sd.trained) is None:
            extra = tracking_overrides(fed, plan, root, identity) if not sd.config.is_file() else []
            files_here = not (plan.site.login or fed.executor == "agents")
            work.train.append(site_training(fed, plan, root, number, previous, extra, files_here=files_here))
        if read_receipt(sd.evaluated) is None:
            sd.path.mkdir(parents=True, exist_ok=True)
            work.evaluate.append(
                SiteWork(plan.site, number, site_config_file(root, plan.site.name), sd.path, receipt=sd.evaluated)
            )
    work.average = number > 0 and read_receipt(rd.averaged) is None
    return work


def site_training(
    fed: FederationConfig,
    plan: SitePlan,
    root: FederationDir,
    number: int,
    previous: Path,
    extra: list[str],
    files_here: bool = True,
) -> SiteWork:
    """A site's training of round `number` from the global model `previous`: its round config written
    (once: `round-NNN/<site>/site.yaml`, the site's kept config with the round's settings and `extra`)."""
    sd = root.round(number).site(plan.site.name)
    if not sd.config.is_file():
        kept = _previous_checkpoint(fed, root, number, plan.site.name)
        try:
            resolved = round_resolution(
                site_config_file(root, plan.site.name),
                round_overrides(fed, plan, number, previous, kept) + extra,
                files_here=files_here,
            )
        except UserError as exc:  # e.g. the site's data withdrawn since the federation started
            raise UserError(f"{plan.site.name} round {number}: {exc}") from None
        sd.path.mkdir(parents=True, exist_ok=True)
        sd.config.write_text(dump_config(resolved.config), encoding="utf-8")
    return SiteWork(plan.site, number, sd.config, sd.path, run=sd.run, receipt=sd.trained)


def _previous_checkpoint(fed: FederationConfig, root: FederationDir, number: int, site: str) -> Path | None:
    if fed.optimizer_state != "kept" or number == 1:
        return None
    receipt = read_receipt(root.round(number - 1).site(site).trained)
    return Path(receipt["checkpoint"]) if receipt else None
