"""Buffered asynchronous rounds (mode: buffered; FedBuff, Nguyen et al. 2022): no round waits for its
slowest site. Every site loops on its own: it takes the newest global version, trains
`steps_per_round` steps, and its change arrives tagged with the version it started from; each time
aggregation.buffer_size changes are buffered, the coordinator averages them, weighted by tokens x
s(u) (config/staleness.py), and publishes the next version (buffer.py: the record and the publishing).
`rounds` counts the versions published.

This module decides what each site does next and keeps the record of it: a site's contribution is a
task (`buffered/<site>/task-NNN/`, its task.json written before it starts: the version it trains
from), trained in that folder as a round's site trains in its own, so a killed run resumes there.
The executor runs the tasks (for the built-in one, a process per local site, all at once) and hands
each finished one back through `take`. Round 0 evaluates the base model on every site; the last
version is evaluated on every site at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from ...config.load import dump_config
from ...errors import UserError
from ..config.schema import FederationConfig
from ..config.sites import SitePlan, round_overrides, round_resolution
from ..state.history import record_failure
from ..state.layout import FederationDir
from ..state.ownership import federation_id
from ..state.receipts import read_receipt, read_task, read_trained, write_task
from ..state.records import BufferedTask
from ..state.site_configs import keep_site_configs, site_config_file
from .base_model import base_model_dir
from .buffer import VersionBuffer
from .loop import Executor, RoundWork, SiteWork, round_work
from .tracked import tracking_overrides

__all__ = ["BufferedSites", "BufferedExecutor", "run_buffered"]

log = logging.getLogger("supertune")


class BufferedExecutor(Executor, Protocol):
    def run_buffered(self, sites: BufferedSites) -> None:
        """Train every site's tasks (sites.next_task) until sites.finished, handing each finished one to
        sites.take; raise UserError naming the site (and its log) on a failure."""
        ...


@dataclass
class BufferedSites:
    """The sites' tasks of a buffered federation, and the buffer their changes go to."""

    fed: FederationConfig
    plans: list[SitePlan]
    root: FederationDir
    buffer: VersionBuffer
    identity: str = ""

    @property
    def finished(self) -> bool:
        return self.buffer.finished

    def next_task(self, plan: SitePlan) -> SiteWork:
        """The site's task to train now: its unfinished one (resumed, from the version it started
        from), else a new one from the newest version."""
        name = plan.site.name
        taken = self.buffer.contributed(name)
        number = 1
        while (task := read_task(self.root.task(name, number).task_record)) is not None:
            if number not in taken and read_receipt(self.root.task(name, number).trained) is None:
                return self._work(plan, task)
            number += 1
        task = BufferedTask(site=name, task=number, base_version=self.buffer.published)
        write_task(self.root.task(name, number).task_record, task)
        return self._work(plan, task)

    def untaken(self) -> list[SiteWork]:
        """Tasks whose training finished but whose change was not taken (a coordinator killed between
        the two), in site order: taken first when the federation resumes."""
        out = []
        for plan in self.plans:
            taken, number = self.buffer.contributed(plan.site.name), 1
            while (task := read_task(self.root.task(plan.site.name, number).task_record)) is not None:
                if number not in taken and read_receipt(self.root.task(plan.site.name, number).trained) is not None:
                    out.append(self._work(plan, task))
                number += 1
        return out

    def take(self, w: SiteWork) -> None:
        """A task's finished training (its receipt written): its change into the buffer."""
        assert w.receipt is not None
        trained, task = read_trained(w.receipt), read_task(self.root.task(w.name, w.round).task_record)
        if trained is None or task is None:
            raise UserError(f"{w.label}: no finished training in {w.directory} to take")
        self.buffer.arrive(task.task, task.base_version, trained, self.root.task(w.name, task.task).sent)

    def _work(self, plan: SitePlan, task: BufferedTask) -> SiteWork:
        """The task's work, its run config written once (the site's kept config, the task's settings)."""
        td = self.root.task(plan.site.name, task.task)
        if not td.config.is_file():
            start = self.buffer.model(task.base_version)
            extra = tracking_overrides(self.fed, plan, self.root, self.identity)
            try:
                resolved = round_resolution(
                    site_config_file(self.root, plan.site.name),
                    round_overrides(self.fed, plan, task.task, start, None) + extra,
                )
            except UserError as exc:
                raise UserError(f"{plan.site.name} task {task.task}: {exc}") from None
            td.config.write_text(dump_config(resolved.config), encoding="utf-8")
        return SiteWork(plan.site, task.task, td.config, td.path, run=td.run, receipt=td.trained)


def run_buffered(
    fed: FederationConfig,
    plans: list[SitePlan],
    root: FederationDir,
    executor: BufferedExecutor,
    everyone: FederationConfig | None = None,
) -> None:
    """The base model's evaluation, the versions due from the record, the sites' training until the last
    version is published, and the last version's evaluation; the table after each phase."""
    from ..reports.buffered_table import write_buffered_table

    everyone = everyone or fed
    keep_site_configs(root, {plan.site.name: plan.text for plan in plans})
    base = base_model_dir(fed, root)
    identity = federation_id(root)
    buffer = VersionBuffer(fed, root, base)
    sites = BufferedSites(fed, plans, root, buffer, identity)
    try:
        zero = round_work(fed, plans, root, 0, base, base, identity)
        if zero.evaluate:
            executor.run_round(zero)
        buffer.publish_due()  # what the record already decides
        for w in sites.untaken():
            if not buffer.finished:
                sites.take(w)
        if not buffer.finished:
            executor.run_buffered(sites)
        write_buffered_table(everyone, root)
        executor.run_round(_last_evaluation(fed, plans, root, buffer))
    except UserError as exc:
        record_failure(everyone, root, buffer.published + 1, str(exc))  # --status shows it
        raise
    write_buffered_table(everyone, root)
    log.info("%d versions published: %s", buffer.published, root.table_markdown)


def _last_evaluation(
    fed: FederationConfig, plans: list[SitePlan], root: FederationDir, buffer: VersionBuffer
) -> RoundWork:
    """The last version's loss on every site's validation data (those not evaluated yet)."""
    rd = root.round(buffer.published)
    work = RoundWork(buffer.published, buffer.model(buffer.published - 1), rd.global_model, rd.published)
    for plan in plans:
        sd = rd.site(plan.site.name)
        if read_receipt(sd.evaluated) is None:
            sd.path.mkdir(parents=True, exist_ok=True)
            work.evaluate.append(
                SiteWork(plan.site, rd.number, site_config_file(root, plan.site.name), sd.path, receipt=sd.evaluated)
            )
    return work
