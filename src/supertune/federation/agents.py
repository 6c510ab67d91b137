"""The coordinator of a federation whose sites run agents (executor: agents): it never logs in to a
site. It puts the federation config and each round's starting global model on the exchange, waits
there for every site's result of the round (a transfer package and its record), gets and checks each,
averages them here and puts the new global model, then waits for each site's evaluation of it.

Receipts are the built-in executor's: a site's result, once got and checked, is its training receipt
(`trained.json`, pointing at the package in `round-NNN/<site>/sent/`), the attempts its agent
recorded are its `cost.json`, its evaluation is its `evaluated.json`. So the round table, --status,
--plan and a resumed federation read an agents federation as any other. Every wait asks the exchange
once per `poll_seconds` (exchange_wait.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from ..exchange import Exchange, parse_exchange
from ..file_table import file_table
from ..transfer import PACKAGE_MANIFEST, package_problems, read_package
from . import exchange_layout as names
from .builtin import average_phase
from .cost import record_attempt
from .exchange_wait import wait_at_exchange
from .layout import FederationDir
from .receipts import read_receipt, write_receipt
from .rounds import RoundWork, SiteWork
from .schema import FederationConfig

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
            self._config_put = True
        if work.train:
            self._publish(work.number - 1, work.previous)
            self._collect(work)
        if work.average:
            receipts = {name: read_receipt(path) for name, path in work.trained.items()}
            finished = {name: str(r["checkpoint"]) for name, r in receipts.items() if r}
            average_phase(self.fed, work, finished)
        if work.evaluate:
            self._publish(work.number, work.global_model)
            self._wait_for_evaluations(work.evaluate, work.number)

    def _publish(self, number: int, model: Path) -> None:
        """The global model of round `number` on the exchange: its files, then its record."""
        if self.exchange.get_json(names.global_record(number)) is not None:
            return
        log.info("round %d: putting the global model on the exchange %s", number, self.fed.exchange)
        files = self.exchange.put_tree(model, names.global_files(number), file_table(model))
        self.exchange.put_json(names.global_record(number), {"round": number, "files": files})

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
            return True if not pending else None

        wait_at_exchange(ask, self.fed.poll_seconds, lambda: f"{what} of {', '.join(sorted(pending))} at the exchange")

    def _collect(self, work: RoundWork) -> None:
        """Each training site's result of the round, got and checked, as its training receipt."""
        self._each_record(
            work.train, lambda name: names.site_record(name, work.number), self._receive, f"round {work.number}"
        )

    def _receive(self, w: SiteWork, record: dict) -> None:
        label = w.label
        files = record.get("files")
        if not isinstance(files, dict) or PACKAGE_MANIFEST not in files:
            raise UserError(f"{label}: its record on the exchange lists no transfer package; it is not averaged")
        sent = w.directory / "sent"
        self.exchange.get_tree(names.site_files(w.name, w.round), files, sent)
        package = read_package(sent, label)
        damaged = package_problems(package, hashes=False)
        if damaged or set(package.files) - set(files):
            raise UserError(
                f"{label}: the package it sent does not match its manifest ({(damaged or ['files'])[0]}); it is not averaged"
            )
        try:
            receipt = {
                "site": w.name,
                "round": w.round,
                "run": f"(at the site, {record.get('run', '')})",
                "checkpoint": str(sent),
                "step": int(record["step"]),
                "tokens": int(record["tokens"]),
                "loss_tokens": record.get("loss_tokens"),
                "samples": record.get("samples"),
                "eval_loss": record.get("eval_loss"),
                "seconds": float(record.get("seconds") or 0.0),
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{label}: its record on the exchange is incomplete ({exc}); it is not averaged") from None
        for attempt in record.get("attempts") or []:
            if isinstance(attempt, dict):
                record_attempt(w.directory / "cost.json", attempt)
        write_receipt(w.receipt, receipt)
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
