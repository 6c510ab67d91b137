"""The federation directory: every file of a federation has one property here.

    <federation dir>/
      federation.yaml            the federation config as loaded (rerun: supertune federate <dir>)
      federation.json            its id, made with the directory (a site's folder records it: ownership.py)
      sites/<site>.yaml          the site's resolved base run config, kept for every round (site_configs.py)
      sites/sha256.json          the sha256 of each sites/<site>.yaml as supertune wrote it
      round-000/global/          the base model, when it is built here (the embedded default)
      round-000/<site>/evaluated.json   the base model's eval loss on the site's validation data
      round-000/adapter/         LoRA sites, aggregation.lora: adapters: the initial adapter round 1 starts from
      round-NNN/<site>/site.yaml        the site's resolved run config for this round
      round-NNN/<site>/run/             the site's supertune run of this round (resumable)
      round-NNN/<site>/trained.json     receipt: local training finished and verified
      round-NNN/<site>/left_out.json    receipt: the site failed every attempt, was late or skipped; the round was averaged without it
      round-NNN/<site>/cost.json        every attempt of the site's training: job, nodes, submit, start and end times
      round-NNN/<site>/sent/            with transfer settings: what the site sends, a transfer package (its
                                        change or model, encoded; supertune.transfer) and its residual
      privacy/<site>.key                with privacy: the key of the site's noise, made at the site on first
                                        use and never sent (noise_key.py)
      round-NNN/started.json            receipt: when the round's training started (round_deadline counts from it)
      round-NNN/global/                 the averaged model (supertune average's output; LoRA adapters: the global adapter)
      merged/                    LoRA sites, aggregation.lora: adapters: the last global adapter merged into the base
      round-NNN/averaged.json           receipt: the average is published
      round-NNN/benchmarks.json         receipt: the benchmarks' scores of the global model (benchmarks)
      round-NNN/<site>/evaluated.json   receipt: the global model's eval loss on the site's data
      rounds.json, rounds.md, rounds.png   the per-round table and plot
      dropped.json, failures.jsonl      sites dropped with --drop, and every failed attempt (history.py)
      round-NNN/<site>/owner.json       the federation, site and round the folder belongs to (ownership.py;
                                        written by a StreamFlow train step, also in a site's workdir)

    mode: buffered (rounds/buffered.py): round-NNN/global/ is global version NNN, and
      round-NNN/published.json          receipt: version NNN is published, from these arrivals and weights
      buffered/<site>/task-NNN/task.json    the site's NNNth contribution: the version it trains from
      buffered/<site>/task-NNN/site.yaml, run/, train.log, trained.json, cost.json   as a round's site folder
      buffered/<site>/task-NNN/sent/        its change from that version (a transfer package)
      arrivals/arrival-NNNNNN.json          receipt: the NNNNNNth change taken (site, versions, staleness, weight)
      round-NNN/<site>/evaluated.json   round 0 and the last version: the global model's eval loss on the site's data

A receipt is written (atomically) only when its phase is done; a federation resumes at the first
phase of the first round without all its receipts.
"""

from __future__ import annotations

from pathlib import Path

from ..config.load import FEDERATION_FILE

__all__ = ["FederationDir", "RoundDir", "SiteRoundDir"]


class FederationDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / FEDERATION_FILE

    @property
    def identity(self) -> Path:
        """The federation's id (ownership.federation_id)."""
        return self.path / "federation.json"

    @property
    def table_json(self) -> Path:
        return self.path / "rounds.json"

    @property
    def table_markdown(self) -> Path:
        return self.path / "rounds.md"

    @property
    def plot(self) -> Path:
        return self.path / "rounds.png"

    @property
    def merged(self) -> Path:
        """LoRA adapters federations: the last round's global adapter merged into the base model."""
        return self.path / "merged"

    @property
    def streamflow(self) -> Path:
        """StreamFlow's files: the workflow, one streamflow.yml and job file per round, its database."""
        return self.path / "streamflow"

    @property
    def arrivals(self) -> Path:
        """mode: buffered: the arrival receipts, one a change, in the order they came."""
        return self.path / "arrivals"

    def arrival(self, number: int) -> Path:
        return self.arrivals / f"arrival-{number:06d}.json"

    def noise_key(self, site: str) -> Path:
        """privacy: the secret key the site's noise is drawn with (state/noise_key.py); never sent."""
        return self.path / "privacy" / f"{site}.key"

    def buffered_site(self, site: str) -> Path:
        """mode: buffered: the folders of a site's contributions."""
        return self.path / "buffered" / site

    def task(self, site: str, number: int) -> SiteRoundDir:
        """mode: buffered: the folder of a site's `number`th contribution, laid out as a round's site folder."""
        return SiteRoundDir(self.buffered_site(site) / f"task-{number:03d}")

    def round(self, number: int) -> RoundDir:
        return RoundDir(self.path / f"round-{number:03d}", number)


class RoundDir:
    def __init__(self, path: Path, number: int) -> None:
        self.path = path
        self.number = number

    @property
    def global_model(self) -> Path:
        return self.path / "global"

    @property
    def averaged(self) -> Path:
        return self.path / "averaged.json"

    @property
    def published(self) -> Path:
        """mode: buffered: receipt that this global version is published (from which arrivals)."""
        return self.path / "published.json"

    @property
    def benchmarks(self) -> Path:
        """Receipt: the scores of the federation's benchmarks on this round's global model."""
        return self.path / "benchmarks.json"

    @property
    def started(self) -> Path:
        """Receipt: when the round's training first started; its deadline counts from it (deadline.py)."""
        return self.path / "started.json"

    def site(self, name: str) -> SiteRoundDir:
        return SiteRoundDir(self.path / name)


class SiteRoundDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def config(self) -> Path:
        return self.path / "site.yaml"

    @property
    def run(self) -> Path:
        return self.path / "run"

    @property
    def trained(self) -> Path:
        return self.path / "trained.json"

    @property
    def evaluated(self) -> Path:
        return self.path / "evaluated.json"

    @property
    def left_out(self) -> Path:
        """Receipt: the site failed every attempt, was late or was skipped, and the round was averaged
        without it (its reason, its attempts)."""
        return self.path / "left_out.json"

    @property
    def sent(self) -> Path:
        """With transfer settings: the site's result as a transfer package (supertune.transfer), with the
        residual the site keeps for its next round's error feedback."""
        return self.path / "sent"

    @property
    def task_record(self) -> Path:
        """mode: buffered: the task's record (records.BufferedTask), written before its training starts."""
        return self.path / "task.json"

    @property
    def cost(self) -> Path:
        """Every attempt of the site's training this round: job, nodes, submit, start, end (cost.py)."""
        return self.path / "cost.json"
