"""What a StreamFlow round left, read and checked before its receipts are written: every expected
output (StreamFlow's success is not taken on trust: a SLURM job cancelled by scancel ends as a
success there), the trainings on this machine that finished in a failed run, and the errors of an
attempt in StreamFlow's log."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from ....errors import UserError
from ...rounds.failures import FederationError
from ...rounds.log_tail import log_tail
from ...rounds.loop import RoundWork
from ...state.receipts import read_receipt, write_receipt, write_trained
from .cwl import RoundFiles

__all__ = ["record_round", "keep_finished_training", "streamflow_errors", "round_output"]

log = logging.getLogger("supertune")


def record_round(work: RoundWork, files: RoundFiles) -> None:
    """Read and check every output the round should have made, then write its receipts."""
    from ....averaging import read_average_manifest
    from ...rounds.phases import trained_record

    n = work.number
    for w in work.train:
        record = round_output(files, f"trained-{w.name}.json", f"{w.label}: training")
        if record.get("site") != w.name or record.get("round") != n or not isinstance(record.get("tokens"), int):
            raise FederationError(
                f"{w.label}: {files.outdir / f'trained-{w.name}.json'} is not this site's training receipt of round {n}"
            )
        if not w.site.login:
            # On this machine: checked again here, the checkpoint's files against its manifest.
            assert w.run is not None
            try:
                record = trained_record(w.name, n, w.run).as_json()
            except UserError as exc:
                raise FederationError(str(exc)) from None
        assert w.receipt is not None
        write_receipt(w.receipt, record)
    if work.average:
        record = round_output(files, "averaged.json", f"round {n}: average")
        try:
            manifest = read_average_manifest(work.global_model)
        except ValueError as exc:
            raise FederationError(
                f"round {n}: the average reported success, but {work.global_model} is not a published average ({exc})"
            ) from None
        if record.get("round") != n or len(manifest.inputs) != len(work.trained):
            raise FederationError(
                f"round {n}: {files.outdir / 'averaged.json'} does not describe the average in {work.global_model}"
            )
        write_receipt(work.averaged, record)
    for w in work.evaluate:
        record = round_output(files, f"evaluated-{w.name}.json", f"{w.label}: evaluation")
        loss = record.get("eval_loss")
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            raise FederationError(f"{w.label}: {files.outdir / f'evaluated-{w.name}.json'} has no finite eval_loss")
        # What was evaluated: the round's global model (the site read StreamFlow's copy of it).
        record = {**record, "model": str(work.global_model)}
        assert w.receipt is not None
        write_receipt(w.receipt, record)
        log.info("%s: eval loss %.4f of the global model on this site's data", w.label, loss)


def keep_finished_training(work: RoundWork) -> None:
    """After a failed run: the receipts of runs on this machine that did finish (the next
    attempt would only hand their checkpoints out again)."""
    from ...rounds.phases import trained_record

    for w in work.train:
        if not w.site.login and w.run is not None and w.receipt is not None:
            try:
                write_trained(w.receipt, trained_record(w.name, w.round, w.run))
            except UserError:
                continue  # not finished: it resumes from its latest checkpoint next time


def streamflow_errors(log: Path, offset: int, limit: int = 4) -> str:
    """What went wrong in this attempt, from StreamFlow's log (appended to by every attempt): its
    ERROR lines with the step's message under each, once each; else the log's last lines."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return f" (log: {log})"
    found: list[str] = []
    for i, line in enumerate(lines):
        if " ERROR " not in line:
            continue
        detail = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith(("\t", " ")) else ""
        entry = f"{line.split(' ERROR ', 1)[1].strip()} {detail}".strip()
        if entry not in found:
            found.append(entry)
    if not found:
        return log_tail(log, 8)
    return ":\n    " + "\n    ".join(found[:limit]) + f"\n  (StreamFlow's whole log: {log})"


def round_output(files: RoundFiles, name: str, what: str) -> dict[str, Any]:
    path = files.outdir / name
    record = read_receipt(path)
    if record is None:
        raise FederationError(
            f"{what}: StreamFlow reported success but left no {name} in {files.outdir} (a SLURM job cancelled from outside "
            f"ends as a success there); see {files.log}; run the federation again"
        )
    return record
