"""`supertune federate --site NAME EXCHANGE`: a site's agent. It runs at the site (on its login node,
in a `screen`, or as a chain of jobs), only ever connecting out to the exchange: it reads the
federation config there, resolves its site's run config here (its `config`, a path at the site, and
its overrides; its data checked here), then for every round: waits for the round's global model,
gets and checks it, evaluates it on the site's validation data and trains the site's next round from
it (as the built-in executor evaluates and trains a site: local processes, or SLURM jobs on `where`),
encodes what it sends (supertune.transfer, with the federation's transfer settings; the residual
stays here) and puts it on the exchange, its record last. `--submit` runs it as a chain of SLURM
jobs (agent_chain.py).

It keeps its own directory (`--dir`, default runs/<federation>-<site>), laid out as a federation
directory of one site: the global models it got, its runs, receipts and packages. Everything it puts
on the exchange is checked there first (a record already there is a round done): a killed agent, run
again, picks up where it was, and its training resumes from its latest checkpoint.

With a quorum or a deadline the coordinator decides about late and failed sites (coordinator.py), and the
agent follows: its training gets the round's deadline from the coordinator's start record (site
clocks are assumed in step, as NTP keeps them) and is ended there; a training that failed every
attempt (`site_retries` + 1) is reported (`sites/<site>/failed-NNN.json`) instead of ending the
agent; a round decided without it (the global model's record names it, or its start record) is not
trained, sent or evaluated, and the next round trains from the new global model; a round the
coordinator starts again after stopping below its quorum (a new start record) is tried again.

A site dropped from the federation (`supertune federate DIR --drop SITE`, which the coordinator puts on
the exchange as `dropped.json`) is told there: its agent asks while it waits for a round and before it
trains one, and stops (exit 0) with one line saying so, leaving its directory as it is.

With privacy.secure_aggregation (run with --key) the agent sends its change only masked (secure_site.py,
secure_round.py): its key posted and its peers' checked before it trains, then its masked scales and
values for the coordinator's set; while it waits for the round's global model, a later attempt of the
set with this site in it (a site lost after masking) makes it mask again.

An outage of the exchange (ExchangeUnreachable, once the exchange's own retries gave up) does not end
an agent run by hand (`run_agent_through_outages`): it waits OUTAGE_WAIT seconds and runs again from
where it was, as its chain of jobs does between two links (agent_chain.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ....config.load import dump_config
from ....errors import UserError
from ....exchange import Exchange, ExchangeUnreachable, parse_exchange
from ....file_table import file_table, size_and_sha256
from ....resolve import resolve
from ....transfer.package import PACKAGE_MANIFEST
from ...config.schema import FederationConfig, SiteConfig
from ...state.layout import FederationDir
from ...state.receipts import read_attempts, read_receipt, read_trained, write_receipt
from ...state.site_key import agent_key
from . import exchange_layout as names
from .exchange_wait import OUTAGE_WAIT, wait_at_exchange
from .secure_round import round_sites
from .secure_site import current_set, peer_keys, post_key, send_masked

__all__ = ["run_agent", "run_agent_through_outages", "AgentEnd"]

log = logging.getLogger("supertune")


@dataclass(frozen=True)
class AgentEnd:
    """How an agent ended without an error: every round done, or its site dropped from the federation."""

    directory: FederationDir
    """The agent's directory: its rounds, runs and receipts."""
    said: str
    """The one line that says so."""


class _SiteDropped(Exception):
    """The coordinator dropped this agent's site (dropped.json on the exchange): the agent stops."""


def run_agent(site_name: str, where: str, directory: str | None, key: str | None = None) -> AgentEnd:
    """Run the agent of `site_name` against the exchange `where` until the federation's last round, or
    until the coordinator drops the site. `key`: the site's private key file (--key), checked against
    the public key the federation pins for the site before anything is written."""
    address = parse_exchange(where, "FEDERATION (the exchange, with --site)")
    with Exchange(address) as exchange:
        text = _wait_for_config(exchange, where)
        fed = _federation(text)
        site = next((s for s in fed.sites if s.name == site_name), None)
        if site is None:
            raise UserError(
                f"--site: {site_name!r} is not a site of federation {fed.name}; its sites are {', '.join(s.name for s in fed.sites)}"
            )
        private_key = agent_key(fed, site, key)
        root = FederationDir(Path(directory or Path("runs") / f"{fed.name}-{site_name}").expanduser().absolute())
        root.path.mkdir(parents=True, exist_ok=True)
        root.config.write_text(text, encoding="utf-8")
        agent = _Agent(fed, site, root, exchange, private_key)
        try:
            agent.run()
        except _SiteDropped as dropped:
            return AgentEnd(
                root, f"site {site_name}: {dropped}; the agent stops (its runs and receipts stay in {root.path})"
            )
        return AgentEnd(root, f"site {site_name}: every round done; its runs and receipts are in {root.path}")


def run_agent_through_outages(site_name: str, where: str, directory: str | None, key: str | None = None) -> AgentEnd:
    """run_agent for an agent run by hand (`supertune federate --site NAME EXCHANGE`): an outage of the
    exchange is waited out OUTAGE_WAIT seconds at a time, and the agent runs again from where it was (its
    receipts and the exchange's records say where), for as long as the outage lasts; any other error
    ends it. Each wait is said in the log; interrupt the agent to stop waiting."""
    while True:
        try:
            return run_agent(site_name, where, directory, key)
        except ExchangeUnreachable as exc:
            log.warning("site %s: %s", site_name, exc)
            log.warning("site %s: the exchange is unreachable; the agent tries again in %g s, from where it was",
                        site_name, OUTAGE_WAIT)  # fmt: skip
            time.sleep(OUTAGE_WAIT)


def _wait_for_config(exchange: Exchange, where: str) -> str:
    raw = wait_at_exchange(
        lambda: exchange.get_small(names.CONFIG),
        5.0,
        lambda: f"the coordinator to put the federation config on {where}",
    )
    return raw.decode("utf-8")


def _federation(text: str) -> FederationConfig:
    import tempfile

    from ...config.load import load_federation

    with tempfile.TemporaryDirectory(prefix="supertune-agent-") as tmp:
        path = Path(tmp) / "federation.yaml"
        path.write_text(text, encoding="utf-8")
        fed, _ = load_federation(path)
    if fed.executor != "agents":
        raise UserError(f"--site: the federation on the exchange runs with executor: {fed.executor}, not agents")
    return fed


class _Agent:
    def __init__(
        self,
        fed: FederationConfig,
        site: SiteConfig,
        root: FederationDir,
        exchange: Exchange,
        key: bytes | None = None,
    ) -> None:
        self.fed, self.site, self.root, self.exchange, self.key = fed, site, root, exchange, key
        self.peers: dict[str, bytes] = {}  # with secure aggregation: the peers' checked public keys
        # the built-in executor of this one site trains its rounds, here or as its SLURM jobs
        self.local = dataclasses.replace(fed, sites=[site], executor="builtin", exchange=None)
        if fed.aggregation.min_sites is not None or fed.round_deadline:
            # The coordinator decides whether the round goes on without this site. A quorum of 0 here makes
            # the local executor record a failure (left_out.json in this agent's folder of the round, its
            # reason and attempts), which the agent reports, instead of raising it and ending the agent.
            aggregation = dataclasses.replace(fed.aggregation, min_sites=0)
            self.local = dataclasses.replace(self.local, aggregation=aggregation)

    def _resolve(self, base: Path) -> None:
        """The site's run config, resolved here: its own config, overrides and cluster profile, its data
        checked as a run checks it, with the base model as the exchange gave it (a `base_model` path of the
        coordinator's means nothing here)."""
        from ...config.sites import SitePlan, base_overrides
        from ...state.site_configs import keep_site_configs

        overrides = [*self.site.overrides, *base_overrides(self.fed, self.site), f"model.name_or_path={base}",
                     "model.config_overrides="]  # fmt: skip
        resolution = resolve(self.site.config, overrides)
        if resolution.config.model.lora.enabled and self.fed.aggregation.lora == "adapters":
            # the global adapter's adapter_config.json names its base by a path on the coordinator
            raise UserError(
                f"sites ({self.site.name}): its run config trains LoRA adapters, and with executor: agents a global "
                "adapter (aggregation.lora: adapters) would name its base by a path on the coordinator; set "
                "aggregation.lora: merged in the federation config (each round's global model is the full model)"
            )
        self.plan = SitePlan(self.site, resolution.config, dump_config(resolution.config))
        keep_site_configs(self.root, {self.site.name: self.plan.text})

    def _check_dropped(self) -> None:
        """_SiteDropped when the coordinator has dropped this site (one read of the exchange)."""
        dropped = (self.exchange.get_json(names.DROPPED) or {}).get(self.site.name)
        if dropped is not None:
            since = dropped.get("from_round") if isinstance(dropped, dict) else None
            when = f" from round {since} on" if isinstance(since, int) else ""
            raise _SiteDropped(f"dropped from federation {self.fed.name}{when} by its coordinator (--drop)")

    def run(self) -> None:
        name = self.site.name
        previous: Path | None = None
        self._check_dropped()
        for number in range(0, self.fed.rounds + 1):
            record = self._wait_for_global(number, previous)
            model = self._global_model(number, record)
            if number == 0:
                self._resolve(model)
            left_out = record.get("left_out") or {}
            if name in left_out:
                self._left_out_of(number, str(left_out[name]))
            elif self.site.in_round(number) and self.exchange.get_json(names.site_eval(name, number)) is None:
                self._evaluate(number, model)
            following = number + 1
            if following <= self.fed.rounds and self.site.in_round(following):
                self._train_round(following, model)
            previous = model
        log.info("site %s: the federation's %d rounds are done", name, self.fed.rounds)

    def _wait_for_global(self, number: int, previous: Path | None) -> dict:
        """The record of round `number`'s global model, once the coordinator has put it. Meanwhile, if this
        site's training of the round failed and the coordinator starts the round again (it stopped below
        its quorum and was run again), the site tries again."""

        def ask() -> dict | None:
            self._check_dropped()
            record = self.exchange.get_json(names.global_record(number))
            if record is None and previous is not None and self._started_again(number):
                self._train_round(number, previous)
            elif record is None and previous is not None:
                self._masked_again(number, previous)
            return record

        return wait_at_exchange(ask, self.fed.poll_seconds,
                                lambda: f"the global model of round {number} (site {self.site.name})")  # fmt: skip

    def _started_again(self, number: int) -> bool:
        """This site failed round `number` and the coordinator has started the round again, with it."""
        rd = self.root.round(number)
        if read_receipt(rd.site(self.site.name).left_out) is None:
            return False  # (a local file: the exchange is asked only after a failure)
        start = self.exchange.get_json(names.round_start(number))
        kept = read_receipt(rd.started) or {}
        return (
            start is not None
            and start.get("unix") != kept.get("unix")
            and self.site.name not in (start.get("left_out") or {})
        )

    def _global_model(self, number: int, record: dict) -> Path:
        model = self.root.round(number).global_model
        files = record.get("files")
        if not isinstance(files, dict) or not files:
            raise UserError(
                f"exchange: {names.global_record(number)} lists no files; the coordinator's record is damaged"
            )
        self.exchange.get_tree(names.global_files(number), files, model)
        return model

    def _left_out_of(self, number: int, reason: str) -> None:
        """The coordinator averaged round `number` without this site: no evaluation of its global model
        (as the built-in executor evaluates the sites that trained in a round); a package this site sent
        anyway (after the decision) is set aside, so that its next change carries the residual of the
        round that was averaged, as a site that sat the round out does."""
        sd = self.root.round(number).site(self.site.name)
        if sd.sent.is_dir() and not (sd.path / "sent-not-averaged").exists():
            sd.sent.rename(sd.path / "sent-not-averaged")
        log.warning("site %s: left out of round %d by the coordinator (%s); it trains the next round from round "
                    "%d's global model", self.site.name, number, reason, number)  # fmt: skip

    def _train_round(self, number: int, previous: Path) -> None:
        """Train round `number` from `previous` and send the result, unless it was sent, the round was
        decided without this site, or this start of the round has its failure reported already."""
        name = self.site.name
        if self.exchange.get_json(names.site_record(name, number)) is not None:
            return
        self._check_dropped()
        start = wait_at_exchange(
            lambda: self.exchange.get_json(names.round_start(number)),
            self.fed.poll_seconds,
            lambda: f"the start of round {number} (site {name})",
        )
        if name in (start.get("left_out") or {}):
            log.warning("site %s: left out of round %d before it trains (%s)", name, number, start["left_out"][name])
            return
        if self.exchange.get_json(names.global_record(number)) is not None:
            log.warning("site %s: round %d was averaged without it; nothing is sent", name, number)
            return
        rd = self.root.round(number)
        kept = read_receipt(rd.started)
        if kept is None or kept.get("unix") != start.get("unix"):
            if read_receipt(rd.site(name).left_out) is not None:
                log.info("site %s: the coordinator started round %d again; trying again", name, number)
                rd.site(name).left_out.unlink()
            # the coordinator's start, so that the local executor ends the training at the round's deadline
            write_receipt(
                rd.started, {"round": number, "unix": start.get("unix"), "deadline_s": start.get("deadline_s")}
            )
        report = self.exchange.get_json(names.site_failed(name, number))
        if report is not None and report.get("start") == start.get("unix"):
            return
        if self.key is not None and self.fed.privacy.secure_aggregation:
            # every peer's key checked before the site trains: a key that is not pinned stops it here
            post_key(self.exchange, name, number, self.key)
            sites = round_sites(self.fed, number, start.get("left_out"))
            self.peers = peer_keys(self.exchange, self.fed, name, number, sites, self.fed.poll_seconds)
        self._train_and_send(number, previous, start)

    def _evaluate(self, number: int, model: Path) -> None:
        from ...rounds.loop import RoundWork, SiteWork
        from ...state.site_configs import site_config_file
        from ..builtin.executor import BuiltinExecutor

        rd = self.root.round(number)
        sd = rd.site(self.site.name)
        if read_receipt(sd.evaluated) is None:
            # As the built-in executor evaluates a site: a SLURM job on `where` (the agent's node, a login
            # node or a chain's small link, never holds a large model), or a local process.
            work = SiteWork(
                self.site, number, site_config_file(self.root, self.site.name), sd.path, receipt=sd.evaluated
            )
            BuiltinExecutor(self.local).run_round(RoundWork(number, model, model, rd.averaged, evaluate=[work]))
        record = read_receipt(sd.evaluated)
        assert record is not None
        log.info("site %s round %d: eval loss %.4f of the global model on this site's data", self.site.name, number,
                 record["eval_loss"])  # fmt: skip
        self.exchange.put_json(
            names.site_eval(self.site.name, number),
            {
                "eval_loss": record["eval_loss"],
                "eval_tokens": record.get("eval_tokens"),
                "seconds": record.get("seconds"),
            },
        )

    def _train_and_send(self, number: int, previous: Path, start: dict) -> None:
        from ...rounds.loop import RoundWork, site_training
        from ...rounds.site_result import send_result
        from ..builtin.executor import BuiltinExecutor

        name = self.site.name
        rd = self.root.round(number)
        sd = rd.site(name)
        if read_receipt(sd.trained) is None and read_receipt(sd.left_out) is None:
            work = site_training(self.local, self.plan, self.root, number, previous, [])
            BuiltinExecutor(self.local).train(
                RoundWork(number, previous, rd.global_model, rd.averaged, train=[work], trained={name: sd.trained})
            )
        failed = read_receipt(sd.left_out)
        if failed is not None:  # every attempt failed, or ran past the deadline: the coordinator decides
            attempts = [a.as_json() for a in read_attempts(sd.cost) or []]
            report = {"round": number, "start": start.get("unix"), "reason": failed.get("reason"),
                      "tries": failed.get("attempts"), "attempts": attempts}  # fmt: skip
            self.exchange.put_json(names.site_failed(name, number), report)
            log.warning("site %s round %d: %s; reported to the coordinator, which decides whether the round goes on "
                        "without it", name, number, failed.get("reason"))  # fmt: skip
            return
        trained = read_trained(sd.trained)
        assert trained is not None
        if self.key is not None and self.fed.privacy.secure_aggregation:
            self._send_masked(number, previous)
            return
        package = send_result(self.local, self.root, number, name, trained.checkpoint, previous, everyone=self.fed)
        sent = package.directory
        # the package's own table (its residual stays here), and its manifest
        table = {**package.files, PACKAGE_MANIFEST: size_and_sha256(sent / PACKAGE_MANIFEST)}
        files = self.exchange.put_tree(sent, names.site_files(name, number), table)
        self._put_record(number, files, trained, names.site_record(name, number))

    def _send_masked(self, number: int, previous: Path) -> None:
        """The site's trained change of round `number` masked for the coordinator's current set (secure_round.py),
        once per attempt: again whenever the coordinator sets a later attempt while this one waits."""
        name = self.site.name
        trained = read_trained(self.root.round(number).site(name).trained)
        assert trained is not None
        while True:
            current = wait_at_exchange(lambda: current_set(self.exchange, number), self.fed.poll_seconds,
                                       lambda: f"the set of round {number}'s secure sum (site {name})")  # fmt: skip
            attempt, sites = int(current["attempt"]), tuple(current["sites"])
            if name not in sites:
                log.warning("site %s round %d: not in attempt %d's set; nothing is sent", name, number, attempt)
                return
            if self.exchange.get_json(names.site_values_record(name, number, attempt)) is not None:
                return
            counts = {"tokens": trained.tokens, "samples": trained.samples}
            out = self.root.round(number).site(name).path / "secure"
            sent = send_masked(self.exchange, self.fed, name, number, attempt, sites, self.key, self.peers,
                               Path(trained.checkpoint), previous, counts, out)  # fmt: skip
            if sent is not None:
                files = self.exchange.put_tree(sent, names.site_values_files(name, number, attempt), file_table(sent))
                self._put_record(number, files, trained, names.site_values_record(name, number, attempt), attempt)
                return

    def _masked_again(self, number: int, previous: Path) -> None:
        """While the site waits for round `number`'s global model: the coordinator set a later attempt of the
        round's secure sum (a site failed after masking) with this site in it, so it masks again."""
        if self.key is None or not self.fed.privacy.secure_aggregation:
            return
        if read_receipt(self.root.round(number).site(self.site.name).trained) is None:
            return
        current = current_set(self.exchange, number)
        if current is None or self.site.name not in current.get("sites", ()):
            return
        if self.exchange.get_json(names.site_values_record(self.site.name, number, int(current["attempt"]))) is None:
            if not self.peers:
                self.peers = peer_keys(self.exchange, self.fed, self.site.name, number, tuple(current["sites"]),
                                       self.fed.poll_seconds)  # fmt: skip
            self._send_masked(number, previous)

    def _put_record(self, number: int, files: dict, trained, where: str, attempt: int | None = None) -> None:
        """The record of what the site sent of round `number` (`files`, on the exchange already) at `where`."""
        name = self.site.name
        sd = self.root.round(number).site(name)
        attempts = [a.as_json() for a in read_attempts(sd.cost) or []]
        kept = trained.as_json()
        record = {key: kept[key] for key in ("step", "tokens", "loss_tokens", "samples", "eval_loss", "seconds", "run")}
        if attempt is not None:
            record["attempt"] = attempt
        self.exchange.put_json(where, {"round": number, "files": files, "attempts": attempts, **record})
        log.info("site %s round %d: sent %s to the exchange", name, number, ", ".join(sorted(files)))
