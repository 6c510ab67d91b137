"""What each phase of a round leaves behind, written the same way whichever executor ran it: the
receipt of a site's training (after its final checkpoint is checked against its manifest) and the
round's average (the global model and the weights each site got)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...checkpoints.layout import CheckpointDir
from ...checkpoints.manifest import check_files, read_manifest
from ...errors import UserError
from ...rundir import RunDir
from ..config.schema import FederationConfig
from ..state.receipts import write_receipt, write_trained
from ..state.records import TrainedReceipt

if TYPE_CHECKING:
    from ...averaging.server_step import ServerStep
    from .loop import RoundWork, SiteWork

__all__ = ["trained_record", "record_finished_training", "server_step", "average_round", "average_phase"]

log = logging.getLogger("supertune")


def trained_record(site: str, number: int, run_dir: Path) -> TrainedReceipt:
    """The receipt of a site's finished training in `run_dir`: its final checkpoint, verified by sha256."""
    run = RunDir(run_dir)
    label = f"{site} round {number}"
    summary = run.read_summary(label)
    if summary is None:
        raise UserError(f"{label}: the run in {run_dir} has not finished (no summary.json)")
    checkpoint = CheckpointDir(run.checkpoints).latest()
    if checkpoint is None:
        raise UserError(f"{label}: the run in {run_dir} finished without a checkpoint to average")
    manifest = read_manifest(checkpoint)
    problems = check_files(checkpoint, manifest)
    if problems:
        raise UserError(
            f"{label}: {checkpoint} does not match its manifest ({'; '.join(problems[:3])}); delete it and run again"
        )
    return TrainedReceipt(
        site=site,
        round=number,
        run=str(run_dir),
        checkpoint=str(checkpoint),
        step=manifest.step,
        tokens=manifest.tokens_seen,
        loss_tokens=manifest.loss_tokens,
        samples=manifest.samples_seen,
        eval_loss=summary["eval_loss"],
        seconds=float(summary.get("wall_time_s") or 0.0),
    )


def record_finished_training(w: SiteWork) -> bool:
    """Check a site's finished run's checkpoint and write its training receipt; False when the run has
    not finished. A checkpoint that does not match its manifest is refused (FederationError): not averaged."""
    from .attempts import reason_of
    from .failures import FederationError

    assert w.run is not None and w.receipt is not None
    if not RunDir(w.run).summary.is_file():
        return False
    try:
        write_trained(w.receipt, trained_record(w.name, w.round, w.run))
    except UserError as exc:
        raise FederationError(str(exc), reason=f"refused: {reason_of(exc, w.label)}") from None
    return True


def server_step(fed: FederationConfig, previous: Path) -> ServerStep | None:
    """The server optimizer's step from the global model `previous` (its state read beside it, the new
    state published with the output), or None for plain FedAvg (fedavgm, lr 1, no momentum), whose
    average is the global model."""
    from ...averaging import ServerStep

    a = fed.aggregation
    if a.server_optimizer == "fedavgm" and a.server_lr in (None, 1) and not a.server_momentum:
        return None
    return ServerStep(
        global_model=previous,
        lr=a.server_lr,
        momentum=a.server_momentum,
        optimizer=a.server_optimizer,
        beta2=a.server_beta2,
        tau=a.server_tau,
    )


def average_round(
    fed: FederationConfig,
    number: int,
    sites: list[str],
    checkpoints: list[str],
    previous: Path,
    out: Path,
    receipt: Path,
    left_out: dict[str, str] | None = None,
    delta_base: Path | None = None,
) -> dict:
    """Average the sites' checkpoints (in site order) into `out`, and write the round's receipt (with the
    sites `left_out` of the round after failing, and why). `checkpoints` may be transfer packages (what
    the sites sent), whose changes are from `delta_base`."""
    from ...averaging import average_checkpoints, read_average_manifest

    a = fed.aggregation
    # fixed weights by name: the sites averaged may be fewer than the federation's (from_round, left out)
    fixed = {s.name: s.weight for s in fed.sites}
    weights: str | list[float] = (
        [float(fixed[name] or 0.0) for name in sites] if fed.sites and fed.sites[0].weight is not None else a.weights
    )
    server = server_step(fed, previous)
    from ..state.model_files import holds_adapters, weight_bytes

    # LoRA sites with aggregation.lora: merged: the merged models are averaged, on the previous global model
    # (the server step then moves full tensors); adapters: the adapter tensors are (lora.py says why both).
    adapters = bool(checkpoints) and holds_adapters(Path(checkpoints[0]))
    merge_base = previous if adapters and a.lora == "merged" else None
    started = time.time()
    try:
        manifest = read_average_manifest(out)  # published before a kill could write the receipt
    except ValueError:
        # One site left (the others dropped) is allowed: its model goes through the same writer and server step.
        manifest = average_checkpoints(
            checkpoints,
            out,
            weights=weights,
            dtype=a.dtype,
            server=server,
            minimum_inputs=1,
            merge_base=merge_base,
            delta_base=delta_base,
        )
    record = {
        "round": number,
        "global_model": str(out),
        "weights": {name: i["weight"] for name, i in zip(sites, manifest.inputs)},
        "tokens": {name: i["tokens"] for name, i in zip(sites, manifest.inputs)},
        "left_out": dict(left_out or {}),
        # the weights each site sent (LoRA: its adapters), and what each gets back: the new global model's
        "sent_bytes": {name: weight_bytes(c) for name, c in zip(sites, checkpoints)},
        "received_bytes": weight_bytes(out),
        "seconds": time.time() - started,
    }
    if fed.privacy.active:  # what the epsilon accountant reads (reports/epsilon.py)
        record["privacy"] = _noise_record(sites, checkpoints)
    write_receipt(receipt, record)
    return record


def _noise_record(sites: list[str], sent: list[str]) -> dict:
    """The clip norm and each site's noise std, as the packages the round averaged state them (a package
    without them counts as unnoised)."""
    from ...transfer import PACKAGE_MANIFEST, read_package

    clip, noise = 0.0, {}
    for name, path in zip(sites, sent):
        settings = read_package(Path(path)).privacy if (Path(path) / PACKAGE_MANIFEST).is_file() else None
        clip = max(clip, (settings or {}).get("clip_norm", 0.0))
        noise[name] = (settings or {}).get("noise_std", 0.0)
    return {"clip_norm": clip, "noise_std": noise}


def average_phase(fed: FederationConfig, work: RoundWork, finished: dict[str, str]) -> None:
    """The round's average of what the sites that finished sent (checkpoints, or transfer packages whose
    changes are from the round's starting global model), with its receipt."""
    sites = f"{len(finished)} sites" if len(finished) != 1 else "the one site left"
    log.info("round %d: averaging %s into %s", work.number, sites, work.global_model)
    average_round(
        fed,
        work.number,
        list(finished),
        list(finished.values()),
        work.previous,
        work.global_model,
        work.averaged,
        left_out=work.left_out,
        delta_base=work.previous if fed.transfer.delta else None,
    )
