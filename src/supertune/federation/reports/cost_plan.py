"""`supertune federate FEDERATION --plan`: what the rounds still to run are expected to cost, from the
config and the rounds already run, without running anything.

Per round and site: the nodes it trains on (a SLURM site: launch.nodes; a local site, which has no
nodes of its own: its processes, launch.nproc, what its node-hours count), its steps, the node-hours
expected, and the bytes it sends to the aggregator and receives from it. Node-hours come from the
site's earlier rounds (node-hours per step measured, cost.py, times its steps): a federation that has
not run a round has no measure, and a SLURM site's bound is shown instead (nodes x slurm.time, what
the grant is charged at most). Bytes are the weights that move: the model (or a LoRA site's adapter)
up, the global model down; the base model's files when there are some, else the parameters counted
on PyTorch's meta device (no memory, no weights) times the dtype's bytes, which leaves out the files'
small headers.
"""

from __future__ import annotations

from pathlib import Path

from ...weight_files.dtypes import ITEM_SIZE
from ..config.schema import FederationConfig
from ..config.sites import SitePlan
from ..state.layout import FederationDir
from .round_forecast import Link, PlannedRow, forecast_lines

__all__ = ["cost_plan_text"]

_STORED = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
"""model.dtype -> the safetensors dtype its weights are saved in (weight_files.dtypes.ITEM_SIZE gives its bytes)."""


def cost_plan_text(fed: FederationConfig, plans: list[SitePlan], root: FederationDir, link: Link | None = None) -> str:
    """The plan's text; with a measured `link`, also the time of each round left."""
    from ...config.job_values import time_problem, time_seconds
    from ..state.history import dropped_sites
    from ..state.receipts import read_receipt
    from .table import table_rows

    existing = root.config.is_file()
    averaged = (n for n in range(1, fed.rounds + 1) if not existing or read_receipt(root.round(n).averaged) is None)
    first = next(averaged, fed.rounds + 1)
    rows = table_rows(fed, root) if existing else []
    dropped = dropped_sites(root) if existing else {}
    sent, received, said = _weights(fed, plans, root)
    lines = [
        f"# cost plan of federation {fed.name}: "
        + (f"rounds {first}-{fed.rounds} of {fed.rounds} to run, " if first <= fed.rounds else "every round has run, ")
        + f"from its config and {len({r['round'] for r in rows})} round(s) run; nothing is run",
        f"# bytes: {said}",
        "",
        "| round | site | nodes | steps | node-hours | sent MB | received MB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    total_hours = total_sent = total_received = 0.0
    unknown: set[str] = set()
    planned: list[PlannedRow] = []
    for number in range(first, fed.rounds + 1):
        for plan in plans:
            site, cfg = plan.site, plan.config
            if not site.in_round(number) or site.name in dropped:
                continue
            done = root.round(number).site(site.name)
            if existing and (read_receipt(done.trained) or read_receipt(done.left_out)):
                continue  # trained (or left out) already: spent, in the round table
            local = site.where == "local"
            nodes = cfg.launch.nproc if local else cfg.launch.nodes
            measured = [r for r in rows if r["site"] == site.name and r["node_hours"]]
            if measured:
                per_step = sum(r["node_hours"] for r in measured) / (len(measured) * site.steps_per_round)
                hours = per_step * site.steps_per_round
                shown = f"{hours:.4f}"
                total_hours += hours
            else:
                unknown.add(site.name)
                bound = "" if local or time_problem(cfg.slurm.time) else nodes * time_seconds(cfg.slurm.time) / 3600
                shown = f"- (at most {bound:.2f})" if bound else "-"
            total_sent += sent[site.name]
            total_received += received
            timed = [r["train_s"] for r in rows if r["site"] == site.name and r["train_s"]]
            per_step = sum(timed) / (len(timed) * site.steps_per_round) if timed else None
            planned.append(PlannedRow(number, site.name, site.steps_per_round, sent[site.name], received, per_step))
            lines.append(
                f"| {number} | {site.name} | {nodes} | {site.steps_per_round} | {shown} | "
                f"{sent[site.name] / 1e6:.2f} | {received / 1e6:.2f} |"
            )
    lines += [
        "",
        f"total: {total_hours:.4f} node-hours"
        + (f" (without {', '.join(sorted(unknown))}: no round of theirs to measure yet)" if unknown else "")
        + f", {total_sent / 1e6:.2f} MB sent to the aggregator, {total_received / 1e6:.2f} MB received from it",
    ]
    if link is not None:
        averages = [r["average_s"] for r in rows if r["average_s"]]
        lines += forecast_lines(fed, planned, link, sum(averages) / len(averages) if averages else 0.0)
    return "\n".join(lines) + "\n"


def _weights(fed: FederationConfig, plans: list[SitePlan], root: FederationDir) -> tuple[dict[str, int], int, str]:
    """(bytes each site sends, bytes each receives, how they were found)."""
    from ..config.lora_modes import lora_sites
    from ..state.model_files import weight_bytes

    cfg = plans[0].config
    base = Path(fed.base_model) if fed.base_model else root.round(0).global_model
    full = weight_bytes(base) if base.is_dir() else 0
    how = f"the model's weights, {full:,} bytes (the files of {base})"
    stored = _STORED.get(cfg.model.dtype, "F32")
    if full:
        tensors = _tensors(base)
    else:
        params = _parameters(fed, cfg, lora=False)
        tensors = [(stored, params)]
        full = params * ITEM_SIZE[stored]
        how = f"the model's weights, {full:,} bytes ({params:,} parameters x {cfg.model.dtype}, counted on the meta device)"
    mode = lora_sites(fed, [p.config for p in plans])
    if mode is None:
        if not fed.transfer.active:
            return {p.site.name: full for p in plans}, full, f"each site sends and receives {how}"
        up, said = _encoded(fed, tensors)
        return {p.site.name: up for p in plans}, full, f"each site sends {said}, and receives {how}"
    if fed.base_model:
        adapter, said = 0, "unknown before round 1 for a base model of its own (0 counted)"
    else:
        trainable = _parameters(fed, cfg, lora=True)
        adapter = trainable * ITEM_SIZE[stored]
        said = f"{adapter:,} bytes ({trainable:,} adapter parameters x {cfg.model.dtype})"
        if fed.transfer.active:
            adapter, said = _encoded(fed, [(stored, trainable)])
    down = adapter if mode == "adapters" else full
    what = "the global adapter" if mode == "adapters" else f"the merged global model, {how}"
    return {p.site.name: adapter for p in plans}, down, f"each site sends its LoRA adapter, {said}, and receives {what}"


def _encoded(fed: FederationConfig, tensors: list[tuple[str, int]]) -> tuple[int, str]:
    """Bytes of the tensors (dtype, values) as transfer: encodes them (the codec's own count, a
    blockwise codec's scales and padding included; the file's header of a few kB left out), and how."""
    from ...transfer.codec import Codec, encoded_bytes

    t = fed.transfer
    size = encoded_bytes(Codec(t.dtype, t.block_size), tensors)
    values = sum(n for _, n in tensors)
    what = "its change" if t.delta else "its model"
    return size, f"{what} in {t.dtype}, {size:,} bytes ({values:,} values, {size / max(values, 1):.4g} bytes a value)"


def _tensors(directory: Path) -> list[tuple[str, int]]:
    """(dtype, values) of every tensor in a model directory's safetensors files (their headers only)."""
    from ...weight_files.tensor_files import read_header

    return [(e.dtype, e.numel) for f in sorted(directory.glob("*.safetensors")) for e in read_header(f)[0].values()]


def _parameters(fed: FederationConfig, cfg, lora: bool) -> int:
    """The embedded base model's parameters (with `lora`: its adapter's, trainable), counted on the meta
    device: shapes only, nothing allocated."""
    import dataclasses

    import torch

    from ...config.schema import ModelConfig, RunConfig
    from ...modeling.model import build_model
    from ...modeling.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(RunConfig())
    model_cfg = ModelConfig(config_overrides=dict(fed.base_config_overrides), dtype=cfg.model.dtype)
    if lora:
        model_cfg = dataclasses.replace(model_cfg, lora=cfg.model.lora)
    with torch.device("meta"):
        model = build_model(model_cfg, tokenizer)
    wanted = (p for p in model.parameters() if p.requires_grad or not lora)
    return sum(p.numel() for p in wanted)
