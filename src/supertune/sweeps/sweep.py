"""`supertune sweep`: one run of the same config per scale, grouped in a sweep directory.

    <sweep dir>/sweep.json      what was run: config, overrides, scales, batch kept, each run's job
    <sweep dir>/devices-1/      a run directory per scale (config.yaml, metrics.jsonl, summary.json, ...)
    <sweep dir>/devices-2/

Local sweeps (`--nproc 1,2`) train one scale after the other, each in processes of its own (output
in the run's logs/train.log). SLURM sweeps submit one job per scale the way `supertune submit` does
(nodes from the profile's GPUs per node) and return, or wait for the jobs with `--wait`. Both start
their runs through supertune.runs. Every scale's config is resolved, and its job script rendered, before
anything is created or submitted. Nothing here imports torch.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError, first_line
from ..output_dirs import make_output_dir
from ..rundir import RunDir, write_json_atomic
from ..state_records import DamagedFile, Field, read_utf8, record_damage
from .scales import Scale, plan_scales, scaling_kind

__all__ = [
    "SWEEP_FILE",
    "PlannedScale",
    "Sweep",
    "SweepRun",
    "new_sweep",
    "plan_sweep",
    "read_sweep",
    "render_all",
    "run_local",
    "submit_slurm",
    "sweep_root",
    "wait_for_jobs",
]  # fmt: skip

SWEEP_FILE = "sweep.json"


@dataclass
class SweepRun:
    """One scale of a sweep and what became of it."""

    devices: int
    nodes: int
    per_node: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    run_dir: str
    """Relative to the sweep directory."""
    job_id: str | None = None
    state: str = "planned"
    """planned, submitted, finished (a summary.json exists), failed."""


@dataclass
class Sweep:
    """The sweep directory's manifest (sweep.json)."""

    path: Path
    mode: str
    """local (processes on this machine) or slurm."""
    keep: str
    scaling: str
    config: str | None
    overrides: list[str]
    cluster: str | None = None
    runs: list[SweepRun] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    command: str = field(default_factory=lambda: " ".join(["supertune", *sys.argv[1:]]))

    def run_path(self, run: SweepRun) -> Path:
        return self.path / run.run_dir

    def save(self) -> None:
        record = {k: v for k, v in asdict(self).items() if k != "path"}
        write_json_atomic(self.path / SWEEP_FILE, {"sweep": 1, **record})


_SWEEP_FIELDS = {
    "sweep": Field("int"), "mode": Field("str"), "keep": Field("str"), "scaling": Field("str"),
    "config": Field("str", null=True), "overrides": Field("list"), "cluster": Field("str", required=False, null=True),
    "runs": Field("list"), "created": Field("number", required=False), "command": Field("str", required=False),
}  # fmt: skip
_RUN_FIELDS = {
    "devices": Field("int", least=1), "nodes": Field("int", least=1), "per_node": Field("int", least=1),
    "per_device_train_batch_size": Field("int", least=1), "gradient_accumulation_steps": Field("int", least=1),
    "run_dir": Field("str"),
    "job_id": Field("digits", required=False, null=True), "state": Field("str", required=False),
}  # fmt: skip
_SWEEP_FIX = "supertune sweep writes it: restore it, or run the sweep again into a new directory"


def read_sweep(path: str | Path) -> Sweep:
    """The sweep in `path` (a directory holding sweep.json); a damaged file is a DamagedFile."""
    path = Path(path).expanduser().absolute()
    file = path / SWEEP_FILE
    text = read_utf8(file, _SWEEP_FIX)
    if text is None:
        raise UserError(f"{path}: not a sweep directory (no {SWEEP_FILE})")
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise DamagedFile(file, f"not JSON: {first_line(exc)}", _SWEEP_FIX) from None
    damage = record_damage(record, _SWEEP_FIELDS, extra=False)
    if damage is None and not all(isinstance(o, str) for o in record["overrides"]):
        damage = "overrides holds a value that is not text"
    for i, run in enumerate(record.get("runs") or [] if damage is None else []):
        damage = damage or (f"runs[{i}]: {d}" if (d := record_damage(run, _RUN_FIELDS, extra=False)) else None)
    if damage:
        raise DamagedFile(file, damage, _SWEEP_FIX)
    record.pop("sweep", None)
    runs = [SweepRun(**r) for r in record.pop("runs")]
    return Sweep(path=path, runs=runs, **record)


@dataclass(frozen=True)
class PlannedScale:
    scale: Scale
    resolution: Any
    overrides: list[str]
    """The scale's own overrides (after the user's): processes, nodes and batch."""


def plan_sweep(
    config: str | None, overrides: list[str], devices: list[int], keep: str, cluster: str | None
) -> list[PlannedScale]:
    """Every scale's resolved config; one UserError names every scale that cannot run."""
    from ..resolve import resolve

    base = resolve(config, overrides)
    t, profile = base.config.training, base.profile
    global_batch = t.global_batch_size  # the config keeps its global batch itself
    if global_batch and keep == "per-device-batch":
        raise UserError(
            "--keep per-device-batch: the config sets training.global_batch_size, which keeps the global batch at every "
            "scale; remove it (training.global_batch_size=null) or sweep with --keep global-batch"
        )
    per_node, gpus = None, 0
    if cluster is not None:  # processes per node as `submit` counts them (launch.gpus_per_node=0: a CPU job)
        from ..clusters.schema import ClusterProfile
        from ..slurm.job import job_spec

        spec = job_spec(base.config, profile or ClusterProfile(), run_dir="", python="")
        gpus, per_node = spec.gpus_per_node, spec.procs_per_node
    scales = plan_scales(
        devices, per_node, t.per_device_train_batch_size, t.gradient_accumulation_steps, keep, global_batch
    )
    planned, problems = [], []
    for scale in scales:
        extra = _scale_overrides(scale, cluster is not None, gpu_nodes=gpus > 0)
        if keep == "global-batch" and not global_batch:
            extra += [
                f"training.per_device_train_batch_size={scale.per_device_batch}",
                f"training.gradient_accumulation_steps={scale.accumulation}",
            ]
        try:
            planned.append(PlannedScale(scale, resolve(config, overrides + extra), extra))
        except UserError as exc:
            problems.append(f"{scale.devices} devices: {exc}")
    if problems:
        raise UserError("the sweep cannot run at every scale:\n" + "\n".join(f"  - {p}" for p in problems))
    return planned


def _scale_overrides(scale: Scale, slurm: bool, gpu_nodes: bool) -> list[str]:
    if not slurm:
        return [f"launch.nproc={scale.devices}"]
    per_node = f"launch.gpus_per_node={scale.per_node}" if gpu_nodes else f"launch.procs_per_node={scale.per_node}"
    return [f"launch.nodes={scale.nodes}", per_node]


def sweep_root(path: str | None, planned: list[PlannedScale]) -> Path:
    """The sweep directory: --sweep-dir, or <output.runs_root>/<output.name>-sweep-<timestamp>."""
    if path:
        return Path(path).expanduser().absolute()
    cfg = planned[0].resolution.config
    return (
        Path(cfg.output.runs_root).expanduser().absolute() / f"{cfg.output.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    )


def new_sweep(
    root: Path,
    planned: list[PlannedScale],
    mode: str,
    keep: str,
    config: str | None,
    overrides: list[str],
    cluster: str | None,
) -> Sweep:
    """Create the sweep directory and its manifest, each scale planned; never reuse a sweep directory."""
    root = make_output_dir(root, "--sweep-dir", "sweep")  # never reused: a sweep is resumed from its runs
    sweep = Sweep(
        root, mode, keep, scaling_kind(keep), str(Path(config).absolute()) if config else None, list(overrides), cluster
    )
    for p in planned:
        t = p.resolution.config.training
        s = p.scale
        sweep.runs.append(
            SweepRun(
                s.devices, s.nodes, s.per_node, t.per_device_train_batch_size, t.gradient_accumulation_steps, s.name
            )
        )
    sweep.save()
    return sweep


def run_local(sweep: Sweep, planned: list[PlannedScale], say: Any = print) -> bool:
    """Train every scale here, smallest first, each in processes of its own; False when one failed (the rest are not run).

    Every process gets the same CPU threads at every scale (OMP_NUM_THREADS, unless it is set): the
    cores divided by the largest process count. Otherwise one process would use every core and
    two would each use half, and the sweep would compare threads with processes, not devices.
    """
    import os

    from ..runs.local import train_logged

    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // max(r.devices for r in sweep.runs)))
        say(f"{env['OMP_NUM_THREADS']} CPU thread(s) per process at every scale (OMP_NUM_THREADS; set it to choose)")
    for run, p in zip(sweep.runs, planned):
        run_dir = RunDir(sweep.run_path(run))
        log = run_dir.logs / "train.log"
        say(f"{run.devices} process(es): training in {run_dir.path} (log: {log})")
        started = time.monotonic()
        outcome = train_logged(p.resolution, run_dir.path, log, no_resume=True, env=env)
        run.state = "finished" if outcome.exit_code == 0 else "failed"
        sweep.save()
        if run.state == "failed":
            tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
            say(
                f"{run.devices} process(es): training failed (exit code {outcome.exit_code}); the end of {log}:\n{tail}"
            )
            return False
        say(f"{run.devices} process(es): finished in {time.monotonic() - started:.0f} s")
    return True


def submit_slurm(sweep: Sweep, planned: list[PlannedScale], dry_run: bool, say: Any = print) -> None:
    """Create each scale's run directory and job script, and submit it (unless dry_run)."""
    from ..runs.slurm import start_slurm

    for run, p in zip(sweep.runs, planned):
        started = start_slurm(p.resolution, str(sweep.run_path(run)), "--sweep-dir", no_resume=True, dry_run=dry_run)
        if dry_run:
            say(
                f"{run.devices} device(s) = {run.nodes} node(s) x {run.per_node}: job script {started.run.job_script} (not submitted)"
            )
            continue
        run.job_id = started.job_id
        run.state = "submitted"
        sweep.save()
        say(
            f"{run.devices} device(s) = {run.nodes} node(s) x {run.per_node}: job {run.job_id}, run dir {started.run.path}"
        )


def render_all(planned: list[PlannedScale], root: Path) -> None:
    """Render every scale's job script before anything exists: a problem stops the sweep with nothing submitted."""
    from ..runs.slurm import check_renders

    for p in planned:
        check_renders(p.resolution, str(root / p.scale.name), "--sweep-dir")


def wait_for_jobs(sweep: Sweep, poll_s: float | None = None, say: Any = print) -> bool:
    """Wait until every submitted job of the sweep has ended; True when every run finished with a summary."""
    from ..runs.wait import POLL_SECONDS
    from ..runs.wait import wait_for_jobs as wait_loop

    pending = {i: r.job_id for i, r in enumerate(sweep.runs) if r.job_id and r.state == "submitted"}
    for i, state in wait_loop(pending, POLL_SECONDS if poll_s is None else poll_s):
        run = sweep.runs[i]
        done = RunDir(sweep.run_path(run)).summary.exists()
        run.state = "finished" if done and state.state in ("COMPLETED", "UNKNOWN") else "failed"
        sweep.save()
        see = "" if run.state == "finished" else f" (see {sweep.run_path(run) / 'logs'})"
        say(f"{run.devices} device(s): job {run.job_id} {state.state}{see}")
    return all(r.state == "finished" for r in sweep.runs)
