"""The coordinator of a federation whose sites run agents (executor: agents): it never logs in to a
site. It puts the federation config and each round's starting global model on the exchange, waits
there for every site's result of the round (a transfer package and its record), gets and checks each,
averages them here and puts the new global model, then waits for each site's evaluation of it.

Receipts are the built-in executor's: a site's result, once got and checked, is its training receipt
(`trained.json`, pointing at the package in `round-NNN/<site>/sent/`), the attempts its agent
recorded are its `cost.json`, its evaluation is its `evaluated.json`. So the round table, --status,
--plan and a resumed federation read an agents federation as any other. Every wait asks the exchange
once per `poll_seconds` (exchange_wait.py).

A quorum and a deadline (rounds/quorum.py, rounds/deadline.py) decide as with the built-in executor. A round's start
is its `started.json`, put on the exchange (`global/start-NNN.json`) before the global model the round
trains from, so that each agent gives its training the same deadline. A site whose agent reports that
its training failed every attempt (`sites/<site>/failed-NNN.json`, for this start of the round), or
that has neither a result nor such a report at the deadline, is failed, and
`quorum.leave_out_failed_sites` decides: `left_out.json` receipts, or a stop below the quorum that
forgets the round's start, so that running the coordinator again starts the round again with a new
start record, which the failed agents take as their cue to try again. The decision reaches the agents
in the global model's record (`left_out`), and a site skipped before the round's training in its start
record. The sites dropped from the federation (`--drop`) are put on the exchange (`dropped.json`) when
the coordinator starts, and their agents, which ask for it while they wait, stop.

A site left out late (no result at the exchange by the deadline) spent its node-hours all the same:
its agent ends its training at the same deadline and reports its attempts after the decision (a
failure report, or a result sent too late). The coordinator asks for them at the start of every round
and while it waits for the evaluations, until the round after the late one, and keeps them as the
site's `cost.json`, so that the table's cost columns count a late site too.

With privacy.secure_aggregation a site's result is its masked values, after a first exchange of masked
block scales that the coordinator sums and posts (secure_coordinator.py; secure_round.py says the
round): it never gets a transfer package, and averages the masked sum instead of the sites' changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ....errors import UserError
from ....exchange import Exchange, parse_exchange
from ....file_table import file_table
from ....transfer import PACKAGE_MANIFEST, package_problems, read_package
from ...config.durations import deadline_seconds, duration_text
from ...config.schema import FederationConfig
from ...rounds.attempt_policy import AttemptPolicy
from ...rounds.attempts import cut_reason, reason_of
from ...rounds.deadline import forget_start, round_start
from ...rounds.loop import RoundWork, SiteWork
from ...rounds.phases import average_phase
from ...rounds.quorum import sites_needed
from ...state.layout import FederationDir
from ...state.receipts import attempts_from, read_receipt, write_attempts, write_receipt, write_trained
from ...state.records import TrainedReceipt
from . import exchange_layout as names
from .exchange_wait import wait_at_exchange
from .secure_coordinator import secure_average, sum_scales
from .secure_round import VALUES_FILE, round_sites

__all__ = ["AgentsExecutor"]

log = logging.getLogger("supertune")


class AgentsExecutor:
    def __init__(self, fed: FederationConfig, root: FederationDir) -> None:
        assert fed.exchange is not None
        self.fed = fed
        self.root = root
        self.exchange = Exchange(parse_exchange(fed.exchange, "exchange"))
        self._config_put = False

    def run_round(self, work: RoundWork) -> None:
        if not self._config_put:
            self.exchange.put_file(self.root.config, names.CONFIG)
            self._put_dropped()
            self._config_put = True
        self._late_costs(work.number - 1)
        if work.train:
            self._publish(work.number - 1, work.previous)
            self._collect(work)
        if work.average:
            receipts = {name: read_receipt(path) for name, path in work.trained.items()}
            finished = {name: str(r["checkpoint"]) for name, r in receipts.items() if r}
            if self.fed.privacy.secure_aggregation:
                secure_average(self.fed, work, {name: Path(c) for name, c in finished.items()}, self.exchange)
            else:
                average_phase(self.fed, work, finished)
        if work.evaluate:
            self._publish(work.number, work.global_model)
            self._wait_for_evaluations(work.evaluate, work.number)

    def _put_dropped(self) -> None:
        """The sites dropped from the federation (state/history.py) on the exchange, where their agents
        read it and stop; put when it differs from what is there."""
        from ...state.history import dropped_sites

        dropped = dropped_sites(self.root)
        if dropped and self.exchange.get_json(names.DROPPED) != dropped:
            self.exchange.put_json(names.DROPPED, dropped)
            log.info("dropped sites on the exchange, whose agents stop: %s", ", ".join(sorted(dropped)))

    def _publish(self, number: int, model: Path) -> None:
        """The global model of round `number` on the exchange: the start of the round that trains from it
        first, then its files, then its record (with the sites the round was averaged without)."""
        if number < self.fed.rounds:
            self._put_start(number + 1)
        if self.exchange.get_json(names.global_record(number)) is not None:
            return
        log.info("round %d: putting the global model on the exchange %s", number, self.fed.exchange)
        files = self.exchange.put_tree(model, names.global_files(number), file_table(model))
        record = {"round": number, "files": files, "left_out": self._left_out(number)}
        self.exchange.put_json(names.global_record(number), record)

    def _left_out(self, number: int) -> dict[str, str]:
        """The sites left out of round `number`, with the reason: from their receipts (quorum.py)."""
        rd = self.root.round(number)
        receipts = {s.name: read_receipt(rd.site(s.name).left_out) for s in self.fed.sites}
        return {name: str(r.get("reason")) for name, r in receipts.items() if r is not None}

    def _put_start(self, number: int) -> dict:
        """Round `number`'s start (its receipt, made now when it has none) on the exchange, with its deadline
        and the sites already left out of it (--skip-site); put again whenever that changes."""
        seconds = deadline_seconds(self.fed.round_deadline)
        started = round_start(self.root.round(number), seconds)
        record = {"round": number, "unix": started["unix"], "deadline_s": seconds, "left_out": self._left_out(number)}
        if self.exchange.get_json(names.round_start(number)) != record:
            self.exchange.put_json(names.round_start(number), record)
        return record

    def _each_record(
        self,
        works: list[SiteWork],
        record_name: Callable[[str], str],
        take: Callable[[SiteWork, dict], None],
        what: str,
    ) -> None:
        """take(site, record) for each site's record at the exchange, as it arrives."""
        pending = {w.name: w for w in works}

        def ask() -> bool | None:
            for name, w in list(pending.items()):
                record = self.exchange.get_json(record_name(name))
                if record is not None:
                    take(w, record)
                    del pending[name]
            self._late_costs(works[0].round if works else 0)
            return True if not pending else None

        wait_at_exchange(ask, self.fed.poll_seconds, lambda: f"{what} of {', '.join(sorted(pending))} at the exchange")

    def _collect(self, work: RoundWork) -> None:
        """Each training site's result of the round, got and checked, as its training receipt; with a
        quorum or a deadline, a site whose agent reports a failure for this start of the round, whose
        result is refused, or that has sent nothing by the deadline is failed, and the quorum decides."""
        if self.fed.privacy.secure_aggregation:
            return self._collect_masked(work)
        number = work.number
        start = self._put_start(number)
        until = start["unix"] + start["deadline_s"] if start["deadline_s"] else None
        # the attempts are the agents' (each runs its site's under the same policy): here, only the decision
        policy: AttemptPolicy[None] = AttemptPolicy(self.fed, work, until)
        pending = {w.name: w for w in work.train}

        def ask() -> bool | None:
            for name, w in list(pending.items()):
                record = self.exchange.get_json(names.site_record(name, number))
                report = None if record else self.exchange.get_json(names.site_failed(name, number))
                if record is not None:
                    try:
                        self._receive(w, record)
                    except UserError as exc:
                        if not policy.decides:
                            raise
                        policy.fail(w, f"refused: {reason_of(exc, w.label)}", 1)
                        log.warning("%s: %s", w.label, exc)
                elif report is not None and report.get("start") == start["unix"]:  # not one of an earlier start
                    policy.fail(w, *self._failure(w, report))
                else:
                    continue
                del pending[name]
            if pending and until is not None and time.time() >= until:
                late = f"late: no result at the exchange after {duration_text(start['deadline_s'])}"
                for w in pending.values():  # its agent, if alive, ends its training at the same deadline
                    policy.fail(w, late, 1)
                    log.warning("%s: %s", w.label, late)
                pending.clear()
            return True if not pending else None

        wait_at_exchange(
            ask, self.fed.poll_seconds, lambda: f"round {number} of {', '.join(sorted(pending))} at the exchange"
        )
        if policy.failed:
            try:
                policy.leave_out()
            except UserError:
                # Below the quorum: the next run starts the round again, with a new start record that
                # the failed sites' agents take as their cue to try again (with a deadline, already done).
                forget_start(self.root.round(number))
                raise

    def _collect_masked(self, work: RoundWork) -> None:
        """_collect with secure aggregation (secure_round.py): the attempt's set masks both phases; a site of
        the set that fails (its agent's report for this start, or nothing by the deadline) is left to the
        quorum, and the rest mask again as the next attempt, with a deadline of the round's length from
        then. Below the quorum the round stops as _collect's does, and its next start is a new attempt,
        so that no mask is used twice."""
        number = work.number
        start = self._put_start(number)
        seconds = start["deadline_s"]
        until = start["unix"] + seconds if seconds else None
        policy: AttemptPolicy[None] = AttemptPolicy(self.fed, work, until)
        works = {w.name: w for w in work.train}
        current = self.exchange.get_json(names.secure_set(number))
        if current is None or not current.get("sites"):
            sites = round_sites(self.fed, number, start["left_out"])
            current = {"round": number, "attempt": int((current or {}).get("attempt") or 1), "sites": list(sites)}
            self.exchange.put_json(names.secure_set(number), current)
        attempt, sites = int(current["attempt"]), tuple(current["sites"])
        while True:
            scales, failed = self._await_masked(works, sites, start, until,
                                                lambda s, a=attempt: names.site_scales_record(s, number, a))  # fmt: skip
            if not failed:
                sum_scales(self.fed, self.exchange, work, attempt, scales)
                values, failed = self._await_masked(works, sites, start, until,
                                                    lambda s, a=attempt: names.site_values_record(s, number, a))  # fmt: skip
            if not failed:
                break
            for name, (reason, tries) in failed.items():
                policy.fail(works[name], reason, tries)
            sites = tuple(s for s in sites if s not in failed)
            needed = max(2, sites_needed(self.fed, work))  # a secure sum of one site would be its change
            if len(sites) < needed:
                # below the quorum: the next start of the round masks under a new attempt's keys
                self.exchange.put_json(names.secure_set(number), {"round": number, "attempt": attempt + 1, "sites": []})
                forget_start(self.root.round(number))
                said = "; ".join(f"{name}: {reason}" for name, (reason, _) in policy.failed.items())
                raise UserError(
                    f"round {number}: {len(sites)} of {len(work.trained)} sites are left in its secure sum and the "
                    f"round needs {needed} (aggregation.min_sites, 2 at least: a sum of one site is its change); "
                    f"{said}; run `supertune federate {self.root.path}` again to go on (the round starts again, "
                    "masked under new keys), or leave a site out with --skip-site NAME"
                )
            attempt += 1
            self.exchange.put_json(
                names.secure_set(number), {"round": number, "attempt": attempt, "sites": list(sites)}
            )
            until = time.time() + seconds if seconds else None
            log.warning("round %d: %s failed after the others masked against it; attempt %d of the secure sum, "
                        "masked again by %s", number, ", ".join(sorted(failed)), attempt, ", ".join(sites))  # fmt: skip
        for name in sites:
            self._receive(works[name], values[name])
        if policy.failed:
            policy.leave_out()

    def _await_masked(
        self, works: dict[str, SiteWork], sites: tuple[str, ...], start: dict, until: float | None,
        record_name: Callable[[str], str],
    ) -> tuple[dict[str, dict], dict[str, tuple[str, int]]]:  # fmt: skip
        """({site: its record at record_name}, {site: (reason, tries)} of those whose agent reports a failure
        for this start of the round or that have no record by `until`), once every site of `sites` is one."""
        number = works[sites[0]].round if sites else 0
        records: dict[str, dict] = {}
        failed: dict[str, tuple[str, int]] = {}
        pending = list(sites)

        def ask() -> bool | None:
            for name in list(pending):
                record = self.exchange.get_json(record_name(name))
                report = None if record else self.exchange.get_json(names.site_failed(name, number))
                if record is not None:
                    records[name] = record
                elif report is not None and report.get("start") == start["unix"]:
                    failed[name] = self._failure(works[name], report)
                else:
                    continue
                pending.remove(name)
            if pending and until is not None and time.time() >= until:
                for name in pending:
                    failed[name] = (
                        f"late: no masked upload at the exchange after {duration_text(start['deadline_s'])}",
                        1,
                    )
                    log.warning("%s: %s", works[name].label, failed[name][0])
                pending.clear()
            return True if not pending else None

        wait_at_exchange(ask, self.fed.poll_seconds, lambda: f"round {number}'s masked uploads of "
                         f"{', '.join(pending)} at the exchange")  # fmt: skip
        return records, failed

    def _late_costs(self, latest: int) -> None:
        """The cost.json of every site left out late of round `latest` or the one before without one, from
        the attempts its agent reported since (for the round's start: a failure report, or a result sent
        after the deadline); a site whose agent has said nothing yet is asked again next time, until the
        round after. One or two reads of the exchange per such site."""
        for number in range(max(1, latest - 1), latest + 1):
            rd = self.root.round(number)
            for site in self.fed.sites:
                sd = rd.site(site.name)
                left = read_receipt(sd.left_out)
                if left is None or not str(left.get("reason") or "").startswith("late:") or sd.cost.is_file():
                    continue
                start = (read_receipt(rd.started) or {}).get("unix")
                where = names.site_failed(site.name, number)
                report = self.exchange.get_json(where)
                if report is None or (start is not None and report.get("start") != start):
                    where = names.site_record(site.name, number)
                    report = self.exchange.get_json(where)
                if report is None:
                    continue
                try:
                    attempts = attempts_from(report.get("attempts"), where)
                except UserError as exc:
                    log.warning("%s round %d: its attempts' cost is not recorded: %s", site.name, number, exc)
                    attempts = []
                write_attempts(sd.cost, attempts)
                log.info("%s round %d: left out late; the attempts its agent reported since are its cost (%d)",
                         site.name, number, len(attempts))  # fmt: skip

    def _failure(self, w: SiteWork, report: dict) -> tuple[str, int]:
        """(reason, attempts) of a site whose agent reports that its training failed; its attempts' cost kept."""
        try:
            attempts = attempts_from(report.get("attempts"), names.site_failed(w.name, w.round))
        except UserError as exc:  # the failure stands; only its cost is not known
            log.warning("%s: its attempts' cost is not recorded: %s", w.label, exc)
            attempts = []
        write_attempts(w.directory / "cost.json", attempts)
        reason = cut_reason(str(report.get("reason") or "failed at the site"))
        tries = report.get("tries")
        tries = tries if isinstance(tries, int) and not isinstance(tries, bool) else len(attempts)
        log.warning("%s: its agent reports %s (%d attempt%s)", w.label, reason, tries, "s" if tries != 1 else "")
        return reason, tries

    def _receive(self, w: SiteWork, record: dict) -> None:
        label = w.label
        files = record.get("files")
        sent = w.directory / "sent"
        if self.fed.privacy.secure_aggregation:
            # its masked values only (their header is checked when they are summed): no package, no manifest
            if not isinstance(files, dict) or set(files) != {VALUES_FILE}:
                raise UserError(f"{label}: its record on the exchange lists {sorted(files or {})}, not its masked "
                                f"{VALUES_FILE} alone; it is not averaged")  # fmt: skip
            attempt = int(record.get("attempt") or 1)
            self.exchange.get_tree(names.site_values_files(w.name, w.round, attempt), files, sent)
            package = None
        else:
            if not isinstance(files, dict) or PACKAGE_MANIFEST not in files:
                raise UserError(f"{label}: its record on the exchange lists no transfer package; it is not averaged")
            self.exchange.get_tree(names.site_files(w.name, w.round), files, sent)
            package = read_package(sent, label)
            damaged = package_problems(package, hashes=False)
            if damaged or set(package.files) - set(files):
                raise UserError(
                    f"{label}: the package it sent does not match its manifest ({(damaged or ['files'])[0]}); it is not averaged"
                )
        try:
            receipt = TrainedReceipt(
                site=w.name,
                round=w.round,
                run=f"(at the site, {record.get('run', '')})",
                checkpoint=str(sent),
                step=int(record["step"]),
                tokens=int(record["tokens"]),
                loss_tokens=record.get("loss_tokens"),
                samples=record.get("samples"),
                eval_loss=record.get("eval_loss"),
                seconds=float(record.get("seconds") or 0.0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{label}: its record on the exchange is incomplete ({exc}); it is not averaged") from None
        # every attempt the site's agent made (its own cost.json), as this site's cost: the same list each time
        attempts = attempts_from(record.get("attempts"), names.site_record(w.name, w.round))
        write_attempts(w.directory / "cost.json", attempts)
        write_trained(w.receipt, receipt)
        if package is None:
            log.info(
                "%s: got its masked values from the exchange (%d bytes)", label, (sent / VALUES_FILE).stat().st_size
            )
        else:
            log.info("%s: got its result from the exchange (%s, %.2f MB of weights)", label, package.codec.name,
                     package.sent_weight_bytes / 1e6)  # fmt: skip

    def _wait_for_evaluations(self, works: list[SiteWork], number: int) -> None:
        def take(w: SiteWork, record: dict) -> None:
            try:
                loss = float(record["eval_loss"])
            except (KeyError, TypeError, ValueError):
                raise UserError(f"{w.label}: its evaluation on the exchange holds no eval_loss") from None
            assert w.receipt is not None
            receipt = {"eval_loss": loss, "model": f"{self.fed.exchange}/{names.global_files(number)}"}
            for key, kind in (("eval_tokens", int), ("seconds", (int, float))):
                if isinstance(record.get(key), kind) and not isinstance(record.get(key), bool):
                    receipt[key] = record[key]
            write_receipt(w.receipt, receipt)
            log.info("%s: eval loss %.4f of the global model on this site's data (from its agent)", w.label, loss)

        self._each_record(works, lambda name: names.site_eval(name, number), take, f"round {number} evaluation")
