"""`supertune report`: a markdown table (and report.json) of a sweep's runs, or of run directories.

Columns: devices, nodes, train time, tokens/s, speedup, scaling efficiency, MFU, eval loss, each
read from the run's summary.json:

    train time   train_runtime_s (the Trainer's train(), evaluation and checkpoints during it included)
    tokens/s     throughput_tokens_per_s: non-padding tokens per second over all devices, steps after
                 the first, evaluation and saving left out
    speedup      tokens/s over the tokens/s of the run with the fewest devices
    efficiency   speedup / (devices / the fewest devices): strong scaling when the global batch is the
                 same in every run, weak when the per-device batch is
    MFU          mfu: model FLOPs per second per device over the device's peak (n/a on CPU)

Plots (sweeps.plots) go next to report.md. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..config.load import read_saved_sections
from ..errors import UserError
from ..json_lines import read_records
from ..output_dirs import make_output_dir, marked_as
from ..rundir import RunDir, holds_run, write_json_atomic
from ..state_records import DamagedFile, Field, record_damage
from .sweep import SWEEP_FILE, read_sweep

__all__ = ["RunResult", "ScalingRow", "load_runs", "markdown_table", "scaling_rows", "write_report"]


@dataclass(frozen=True)
class RunResult:
    """One run as the report reads it."""

    run: RunDir
    summary: dict[str, Any] | None
    """None while the run has not finished."""
    config: dict[str, Any]
    devices: int
    nodes: int

    @property
    def label(self) -> str:
        return f"{self.devices} device{'s' if self.devices != 1 else ''}" + (
            f", {self.nodes} nodes" if self.nodes > 1 else ""
        )

    @property
    def per_device_batch(self) -> int:
        t = self.config.get("training", {})
        return t.get("per_device_train_batch_size", 0) * t.get("gradient_accumulation_steps", 1)

    @cached_property
    def records(self) -> list[dict[str, Any]]:
        """metrics.jsonl, one dict per line (empty when there is none), read once for every plot. A
        line cut short (the run was killed while appending it) is left out: the plots show what was
        written whole."""
        records = read_records(self.run.metrics)
        for number, record in enumerate(records, 1):
            damage = record_damage(record, METRIC_FIELDS)
            if damage:
                raise DamagedFile(
                    self.run.metrics,
                    damage,
                    "remove that record (the plots need a step and numbers), or report without the run",
                    f"record {number}",
                )
        return records


_MEASURED = (
    "loss",
    "eval_loss",
    "learning_rate",
    "throughput_tokens_per_s",
    "mfu",
    "tokens_seen",
    "num_input_tokens_seen",
)
METRIC_FIELDS = {
    "step": Field("int", least=0),
    **{name: Field("number", required=False, null=True) for name in ("loss", "eval_loss")},
    **{name: Field("number", required=False, null=True, least=0) for name in _MEASURED if "loss" not in name},
}
"""What the report reads of a metrics.jsonl record (train/trainer/callbacks.py writes a step into each; null: not
measured); a negative step, learning rate, throughput, MFU or token count is damage."""


TRAINING_FIELDS = {
    name: Field("int", required=False, least=1)
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps")
}
"""What the report reads of a run's config.yaml (the training section): the batch that says strong or weak scaling."""
_CONFIG_FIX = "supertune writes it when a run starts: restore it, or report without the run"


@dataclass(frozen=True)
class ScalingRow:
    devices: int
    nodes: int
    train_time_s: float | None
    tokens_per_s: float | None
    speedup: float | None
    efficiency: float | None
    mfu: float | None
    mfu_note: str
    eval_loss: float | None
    run_dir: str


def load_runs(paths: list[str]) -> tuple[list[RunResult], str | None, str]:
    """The runs of a sweep directory or of run directories, fewest devices first; (runs, scaling, title).

    scaling: strong or weak as the sweep kept it (for loose runs: strong when every global batch is
    equal, weak when every per-device batch is), None when neither or one run."""
    if len(paths) == 1 and (Path(paths[0]) / SWEEP_FILE).exists():
        sweep = read_sweep(paths[0])
        runs = [_load(sweep.run_path(r), r.devices, r.nodes) for r in sweep.runs]
        title = f"{sweep.path.name}: {sweep.mode} sweep, --keep {sweep.keep}" + (
            f", cluster {sweep.cluster}" if sweep.cluster else ""
        )
        return runs, sweep.scaling, title
    missing = [p for p in paths if not holds_run(Path(p))]
    if missing:
        raise UserError(
            f"RUN_DIR: {', '.join(map(repr, missing))} holds no run (config.yaml) nor a sweep ({SWEEP_FILE})"
        )
    runs = sorted((_load(Path(p)) for p in paths), key=lambda r: (r.devices, str(r.run.path)))
    return runs, _inferred_scaling(runs), ", ".join(r.run.path.name for r in runs)


def _load(path: Path, devices: int | None = None, nodes: int | None = None) -> RunResult:
    run = RunDir(Path(path).expanduser().absolute())
    summary = run.read_summary(f"RUN_DIR {run.path}")
    config = read_saved_sections(run.config, _CONFIG_FIX) if run.config.exists() else {}
    damage = record_damage(config.get("training", {}), TRAINING_FIELDS)
    if damage:
        raise DamagedFile(run.config, f"training.{damage}", _CONFIG_FIX)
    if summary is not None:
        devices, nodes = int(summary.get("world_size") or devices or 1), int(summary.get("nodes") or nodes or 1)
    return RunResult(run, summary, config or {}, devices or 1, nodes or 1)


def _inferred_scaling(runs: list[RunResult]) -> str | None:
    done = [r for r in runs if r.summary]
    if len(done) < 2:
        return None
    if len({r.per_device_batch * r.devices for r in done}) == 1:
        return "strong"
    if len({r.per_device_batch for r in done}) == 1:
        return "weak"
    return None


def scaling_rows(runs: list[RunResult]) -> list[ScalingRow]:
    """One row per run; speedup and efficiency against the finished run with the fewest devices (none for one run)."""
    base = next((r for r in runs if r.summary and _rate(r.summary)), None) if len(runs) > 1 else None
    rows = []
    for r in runs:
        s = r.summary or {}
        rate = _rate(s)
        speedup = rate / _rate(base.summary) if base and rate else None
        rows.append(ScalingRow(
            devices=r.devices, nodes=r.nodes, train_time_s=s.get("train_runtime_s"), tokens_per_s=rate, speedup=speedup,
            efficiency=speedup / (r.devices / base.devices) if speedup is not None else None,
            mfu=s.get("mfu"), mfu_note=_mfu_note(s), eval_loss=s.get("eval_loss"), run_dir=str(r.run.path),
        ))  # fmt: skip
    return rows


def _rate(summary: dict[str, Any] | None) -> float | None:
    if not summary:
        return None
    return summary.get("throughput_tokens_per_s") or summary.get("tokens_per_second") or None


def _mfu_note(summary: dict[str, Any]) -> str:
    if not summary:
        return "not finished"
    if summary.get("mfu") is not None:
        return ""
    return "n/a (CPU)" if str(summary.get("peak_source", "")).startswith("CPU") else "n/a"


def markdown_table(rows: list[ScalingRow], scaling: str | None) -> str:
    """The table; every number as the runs' summaries give it, rounded for reading."""
    efficiency = f"{scaling}-scaling efficiency" if scaling else "scaling efficiency"
    header = ["devices", "nodes", "train time (s)", "tokens/s", "speedup", efficiency, "MFU", "eval loss"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---:"] * len(header)) + " |"]
    for r in rows:
        cells = [
            str(r.devices), str(r.nodes), _fmt(r.train_time_s, "{:.1f}"), _fmt(r.tokens_per_s, "{:,.0f}"),
            _fmt(r.speedup, "{:.2f}x"), _fmt(r.efficiency, "{:.0%}"), _fmt(r.mfu, "{:.1%}") if r.mfu is not None else r.mfu_note,
            _fmt(r.eval_loss, "{:.4f}"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def write_report(paths: list[str], out: str | None = None) -> tuple[Path, str]:
    """Write report.md, report.json and the plots into `out`; returns (out, the markdown table).

    out defaults to <sweep dir>/report, <run dir>/report for one run, ./report for several."""
    from .plots import run_plots, scaling_plots

    runs, scaling, title = load_runs(paths)
    folder = Path(out) if out else (Path(paths[0]) / "report" if len(paths) == 1 else Path("report"))
    folder = make_output_dir(folder, "--out", "report", own=_own_report, mark="report")
    rows = scaling_rows(runs)
    table = markdown_table(rows, scaling)
    images = run_plots(runs[0], folder) if len(runs) == 1 else scaling_plots(runs, rows, folder)
    text = [f"# supertune report: {title}", "", table]
    if len(runs) > 1:
        text.append(_explain(scaling, runs))
    text += [f"![{p.stem}]({p.name})" for p in images]
    (folder / "report.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    record = {"title": title, "scaling": scaling, "rows": [asdict(r) for r in rows], "plots": [p.name for p in images]}
    write_json_atomic(folder / "report.json", record)
    return folder, table


def _own_report(folder: Path) -> bool:
    """A report folder supertune wrote: its marker, or (written before markers) report.md beside report.json."""
    return marked_as("report")(folder) or all((folder / name).is_file() for name in ("report.md", "report.json"))


def _explain(scaling: str | None, runs: list[RunResult]) -> str:
    fewest = runs[0].devices
    kept = {"strong": "the same global batch in every run", "weak": "the same per-device batch in every run"}
    kept_here = kept.get(scaling or "", "batches that differ in other ways")
    return (
        f"tokens/s: non-padding tokens per second over all devices, steps after the first, evaluation and saving left out. "
        f"Speedup: tokens/s over the {fewest}-device run's; efficiency: speedup / (devices / {fewest}), with {kept_here}. "
        f"MFU: model FLOPs (summary.json flops_formula) per second per device over the device's peak (peak_source).\n"
    )
