"""The federation config schema: sites that train the same base model on their own data, and the
rounds that average them. One typed dataclass per section, a docstring under every field (as in
the run config); YAML is only data (`federation.load` builds and checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from ...averaging.server_optimizers import DEFAULT_SERVER_OPTIMIZER, server_optimizer_names
from ...config.choices import OneOf
from .executors import executor_names
from .staleness import staleness_names

__all__ = [
    "AggregationConfig",
    "StalenessConfig",
    "SiteConfig",
    "StreamFlowConfig",
    "TransferConfig",
    "PrivacyConfig",
    "FederationConfig",
]


@dataclass
class StalenessConfig:
    """mode: buffered: how much less a change counts the more global versions its starting model is behind (u); formulas in docs/federated/buffered.md."""

    kind: Annotated[str, OneOf(staleness_names)] = "polynomial"
    """constant: s(u) = 1; polynomial: s(u) = (u + 1)^-a; hinge: s(u) = 1 if u <= b, else 1 / (a (u - b) + 1)."""
    a: float = 0.5
    """polynomial, hinge: how fast the weight falls with staleness (a positive number)."""
    b: float = 4.0
    """hinge: the staleness up to which a change keeps its whole weight."""


@dataclass
class AggregationConfig:
    """How the sites' models become the next global model (`supertune average`)."""

    weights: Literal["tokens", "samples", "uniform"] = "tokens"
    """Weight of each site: the tokens (or sequences) it trained on this round, or equal; a site's `weight` overrides."""
    dtype: Literal["same", "fp32", "bf16", "fp16"] = "same"
    """Dtype of the global model's tensors: same keeps each tensor's, e.g. fp16 halves a bf16-trained model's files."""
    server_optimizer: Annotated[str, OneOf(server_optimizer_names)] = DEFAULT_SERVER_OPTIMIZER
    """How the averaged change moves the global model: fedavgm (momentum 0 and lr 1: plain FedAvg), fedadam, fedyogi, fedadagrad (Reddi et al. 2021), nesterov (DiLoCo's outer step); formulas in docs/federated/server-optimizers.md."""
    server_lr: float | None = None
    """Server learning rate; empty: the optimizer's default, 1 for fedavgm (plain FedAvg), 0.7 for nesterov, 0.01 for fedadam, fedyogi, fedadagrad."""
    server_momentum: float | None = None
    """Server momentum (beta1) in [0, 1); empty: 0 for fedavgm (none kept), 0.9 for the others."""
    server_beta2: float = 0.99
    """fedadam, fedyogi: decay of the second moment, in [0, 1)."""
    min_sites: int | None = None
    """Quorum: a round is averaged when at least this many of its sites finished training, leaving out those that failed every attempt (site_retries); empty: every site of the round, and a site that fails stops the federation."""
    server_tau: float = 0.001
    """fedadam, fedyogi, fedadagrad: added to the square root of the second moment, which starts at server_tau^2; smaller is more adaptive."""
    buffer_size: int = 2
    """mode: buffered: K, the changes buffered before the coordinator averages them into the next global version."""
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    """mode: buffered: the staleness weight s(u); a change's weight is its tokens (aggregation.weights) x s(u)."""
    max_staleness: int | None = None
    """mode: buffered: a change whose starting model is more versions behind than this is recorded and dropped; empty: none is dropped."""
    lora: Literal["adapters", "merged"] = "adapters"
    """With LoRA sites (model.lora.enabled): adapters averages the A and B tensors into a global adapter the sites keep training; merged averages the merged models (base + s*B@A) into a full model, and sites start a fresh adapter on it each round. See docs/federated/lora.md."""


@dataclass
class TransferConfig:
    """What each site sends to the aggregator after its training (docs/federated/transfers.md, "Sending less")."""

    delta: bool = False
    """Send the change from the round's global model instead of the model (with error feedback: what dtype loses of it is added to the site's next change)."""
    dtype: Literal["same", "bf16", "fp16", "int8", "int4"] = "same"
    """How the values travel: same (each tensor's own dtype), bf16, fp16 (2 bytes a value), int8 or int4 (blockwise absmax quantisation, 1 or 0.5 byte a value + 4/block_size; need delta)."""
    block_size: int = 64
    """int8, int4: values per block sharing one float32 scale; a multiple of 8 from 8 to 65536 (smaller: more precise, more bytes)."""

    @property
    def active(self) -> bool:
        """Whether sites send a transfer package rather than their checkpoint's weights."""
        return self.delta or self.dtype != "same"


@dataclass
class PrivacyConfig:
    """Differential privacy of what each site sends: its change clipped, then noised at the site (docs/federated/privacy.md)."""

    clip_norm: float | None = None
    """Each site's change (its model minus the round's global model, every trained tensor together) is scaled down to at most this L2 norm before it leaves the site; empty: no clipping, no noise. Needs transfer.delta: true."""
    noise_multiplier: float = 0.0
    """z: each of the round's n sites adds Gaussian noise N(0, (z clip_norm)^2 / n) to every value of its clipped change, so that the sum of the n changes carries noise of standard deviation z clip_norm (distributed DP); 0: clipping only, no privacy guarantee."""
    delta: float = 1e-5
    """The delta at which the spent epsilon is reported (rounds.md, rounds.json, --status), in (0, 1); smaller than 1 / (the number of sites) is usual."""
    secure_aggregation: bool = False
    """Each site masks its int8/int4 change with masks agreed pairwise with the other sites (X25519 keys pinned in sites[].public_key), which cancel in the sum: the coordinator sees the sites' sum, never one site's change (docs/federated/privacy.md, "Secure aggregation"; executor: agents, every site of a round, no clipping or noise yet)."""

    @property
    def active(self) -> bool:
        """Whether the sites clip (and noise) their changes."""
        return self.clip_norm is not None or self.noise_multiplier != 0


@dataclass
class SiteConfig:
    """One site: its own run config, data and strategy, where it runs, and how much it trains per round."""

    name: str = ""
    """Short name: letters, digits, '-', '_' (names folders and jobs)."""
    config: str | None = None
    """The site's run config YAML (relative to the federation file); empty: supertune's defaults."""
    overrides: list[str] = field(default_factory=list)
    """section.key=value overrides over the site's config, e.g. [data.train_files=/data/de/*.jsonl, distributed.strategy=zero2]."""
    steps_per_round: int = 20
    """Optimizer steps the site trains in each round."""
    where: str = "local"
    """local (processes on this machine, launch.nproc of them), or a cluster profile: the site's SLURM job per round."""
    weight: float | None = None
    """A fixed weight for this site instead of aggregation.weights (all sites or none)."""
    login: str | None = None
    """StreamFlow only: the site's login node as [user@]host[:port], reached over SSH; empty: this machine."""
    workdir: str | None = None
    """StreamFlow only, with login: an absolute directory on the site for its files (global models, runs, StreamFlow's step folders)."""
    python: str | None = None
    """StreamFlow only, with login: the site's Python with supertune installed, e.g. /project/me/supertune/.venv/bin/python."""
    from_round: int = 1
    """The first round the site trains in (it joins from the global model of the round before)."""
    until_round: int | None = None
    """The last round the site trains in; empty: the federation's last."""
    public_key: str | None = None
    """executor: agents: the site's X25519 public key, as `supertune federate --site NAME EXCHANGE --new-key KEYFILE` printed it at the site; its agent (run with --key KEYFILE) is refused unless its key matches, and privacy.secure_aggregation needs it for every site."""

    def in_round(self, number: int) -> bool:
        """Whether the site trains in round `number` (round 0, the base model's evaluation, has every site)."""
        return number == 0 or (self.from_round <= number and (self.until_round is None or number <= self.until_round))


@dataclass
class StreamFlowConfig:
    """Running each round through StreamFlow (executor: streamflow)."""

    command: str = "streamflow"
    """The streamflow executable (0.2.0rc3): a path, or a name on PATH; the default falls back to <repo>/.venv-streamflow/bin/streamflow (scripts/env.sh makes it)."""
    ssh_key: str | None = None
    """Private key for the sites' login nodes; empty: the SSH agent and default keys."""
    polling_seconds: int = 5
    """How often StreamFlow asks a site's SLURM for its jobs."""


@dataclass
class FederationConfig:
    """Federated training: rounds of local training at every site, then a token-weighted average."""

    name: str = "federation"
    """Name of the federation: prefix of its directory and of its jobs."""
    base_model: str | None = None
    """The model every site starts from in round 1: a model directory, a run directory or a local hub id; empty: the embedded tiny Llama, built once with fresh weights."""
    base_config_overrides: dict[str, Any] = field(default_factory=dict)
    """With an empty base_model: fields of the embedded tiny Llama's config to change, e.g. {num_hidden_layers: 2}."""
    seed: int = 42
    """Seed of the base model's fresh weights (empty base_model). A site's data order in round r comes from its own training.data_seed (or seed) + r - 1."""
    mode: Literal["synchronous", "buffered"] = "synchronous"
    """synchronous: a round ends when its sites have trained, then one average; buffered: every site trains on its own from the newest global version and each aggregation.buffer_size changes make the next one (docs/federated/buffered.md)."""
    rounds: int = 3
    """Rounds of local training and averaging (at most 10000); mode: buffered: the global versions to publish."""
    optimizer_state: Literal["fresh", "kept"] = "fresh"
    """fresh: each round's local training starts a new optimizer; kept: a site carries its AdamW moments from round to round (ddp only)."""
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    """Averaging."""
    executor: Annotated[str, OneOf(executor_names)] = "builtin"
    """builtin: local processes and SLURM jobs on clusters reachable from here; streamflow: one `streamflow run` per round; agents: each site runs `supertune federate --site NAME EXCHANGE` and meets this machine at the exchange."""
    exchange: str | None = None
    """executor: agents: where the sites and this machine meet, a directory (a filesystem all of them mount) or ssh://[user@]host[:port]/absolute/path."""
    site_retries: int = 0
    """Times a site's failed training (non-zero exit, a checkpoint that does not match its manifest, a SLURM job sbatch could not submit: tried again poll_seconds later) is run again in the same round (within round_deadline), resuming from its latest checkpoint, before the site counts as failed; a SLURM site's evaluation job that sbatch could not submit is tried again as often, poll_seconds apart."""
    round_deadline: str | None = None
    """Wall clock a round may take from its start, queue time included: 2h, 90m, 1h30m or seconds; then the round is averaged over the sites that finished (at least aggregation.min_sites), late sites' jobs are cancelled and they rejoin next round; empty: none."""
    poll_seconds: float = 5.0
    """Seconds between looks at a site's SLURM job while waiting for it, and before a failed submission is tried again (site_retries)."""
    streamflow: StreamFlowConfig = field(default_factory=StreamFlowConfig)
    """StreamFlow settings."""
    transfer: TransferConfig = field(default_factory=TransferConfig)
    """What sites send: their model or their change, and in which dtype."""
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    """Differential privacy: each site's change clipped and noised before it is sent, and the epsilon spent."""
    benchmarks: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks run on every round's global model, in the federation's own process after the round: supertune_corpus (the embedded, offline), a harness task (its data in the local Hugging Face datasets cache) or a task YAML file; the round table (rounds.md, rounds.json) gains their scores; []: none."""
    sites: list[SiteConfig] = field(default_factory=list)
    """The sites, two or more."""
