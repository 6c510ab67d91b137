"""The built-in executor's buffered rounds (mode: buffered) with local sites: one training at a time per
site, every site's at once, each in processes of its own started as a synchronous round's local site
is (local_training.py), from a thread that waits for it. This thread alone takes the finished ones,
in the order they finish (sites in config order when several finish between two looks), so the record
(rounds/buffer.py) is written by one writer; a site whose change was taken starts its next task from
the newest version at once. A task whose training fails is tried again (resuming from its latest
checkpoint) up to `site_retries` more times, as a synchronous round's site is; then it stops the
federation, naming the site (run it again to resume, or --drop the site). When the last version is
published the tasks still training are asked to stop (their run's stop request) and waited for; their
work is not taken."""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ....rundir import RunDir
from ...config.schema import FederationConfig
from ...rounds.attempt_policy import Ending, attempts_allowed, say_retry
from ...rounds.buffered import BufferedSites
from ...rounds.failures import FederationError
from ...rounds.loop import SiteWork
from ...state.cost import record_attempt
from .local_training import LocalTraining

__all__ = ["train_buffered"]

log = logging.getLogger("supertune")


def train_buffered(fed: FederationConfig, sites: BufferedSites) -> None:
    """Every site's tasks until the buffer has published the federation's last version."""
    local = LocalTraining(fed, None)
    order = {s.name: i for i, s in enumerate(fed.sites)}
    plans = {p.site.name: p for p in sites.plans}
    attempts = attempts_allowed(fed)
    running: dict[Future[Ending], tuple[SiteWork, int]] = {}
    with ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="site") as pool:

        def start(name: str) -> None:
            w = sites.next_task(plans[name])
            log.info("%s task %d: training from version %d", name, w.round, sites.buffer.published)
            running[pool.submit(local.start, w, 1)] = (w, 1)

        try:
            for name in plans:
                start(name)
            while not sites.finished:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: order[running[f][0].name]):
                    w, tries = running.pop(future)
                    if not _took(w, future.result(), tries, attempts):
                        running[pool.submit(local.start, w, tries + 1)] = (w, tries + 1)
                        continue
                    sites.take(w)
                    if sites.finished:
                        break
                    start(w.name)
        finally:
            _stop({f: w for f, (w, _) in running.items()})


def _took(w: SiteWork, ending: Ending, tries: int, attempts: int) -> bool:
    """A task's attempt recorded (cost.json): True when it finished; False when it failed and is tried
    again; a failure with no attempt left stops the federation."""
    if ending.cost is not None:
        record_attempt(w.directory / "cost.json", ending.cost)
    if ending.reason is None:
        return True
    if tries < attempts and ending.again:
        say_retry(f"{w.name} task {w.round}", tries, attempts, ending.message or ending.reason)
        return False
    raise FederationError(ending.message or f"{w.label}: {ending.reason}", reason=ending.reason)


def _stop(running: dict[Future[Ending], SiteWork]) -> None:
    """Ask every task still training to stop at its next step, again until it has (a request made while
    its run was starting is cleared by the start), and wait for it."""
    while running:
        for w in running.values():
            if w.run is not None and w.run.is_dir():
                RunDir(w.run).stop_request.touch()
        done, _ = wait(running, timeout=1.0)
        for future in done:
            w = running.pop(future)
            if future.exception() is None:
                if future.result().cost is not None:
                    record_attempt(w.directory / "cost.json", future.result().cost)
                log.info("%s task %d: stopped, the last version is published", w.name, w.round)
        time.sleep(0.1 if running else 0)
