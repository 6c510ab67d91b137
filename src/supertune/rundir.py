"""The run directory: the unit of reproducibility (resolved config, metrics, checkpoints, model, summary)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .errors import UserError, first_line
from .output_dirs import make_output_dir
from .state_records import Field, record_damage

__all__ = ["RunDir", "create_run_dir", "holds_run", "run_of_model", "write_json_atomic"]

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
STOP_REQUEST_FILE = "stop-request"
"""Created (by the job script, or by `supertune train` for its workers) to ask a run to checkpoint and stop."""
STOPPED_FILE = "stopped.json"
"""Written by the main process when a run stopped on request after saving its checkpoint."""
LOG_DIR = "logs"
"""Job logs (stdout and stderr of every SLURM job of the run)."""


SUMMARY_FIELDS = {
    **{name: Field("int", required=False, least=1) for name in ("world_size", "nodes")},
    **{name: Field("int", required=False, least=0) for name in ("train_steps", "train_tokens", "eval_tokens")},
    **{name: Field("number", required=False, null=True) for name in ("eval_loss", "perplexity", "unigram_perplexity", "train_loss")},
    **{
        name: Field("number", required=False, null=True, least=0)
        for name in (
            "train_runtime_s", "tokens_per_second", "resumed_from_step", "wall_time_s", "padding_share",
            "throughput_tokens_per_s", "mfu", "train_loss_tokens",
        )
    },
}  # fmt: skip
"""The numbers of summary.json that readers compute with (train/lifecycle/run.py writes them): a string there is
damage, and so is a value no run can have (0 processes or nodes, a negative count, time or rate)."""


STOPPED_FIELDS = {
    "step": Field("int", least=0),
    "reason": Field("str"),
    "checkpoint": Field("str"),
}
"""What `supertune train` reports of a stop on request (train/lifecycle/run.py writes stopped.json)."""


class RunDir:
    """Names of the files in a run directory: every path of a run is one of these properties."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    def read_summary(self, label: str) -> dict[str, Any] | None:
        """summary.json as a dict; None while the run has not finished. A file that is not a JSON
        object (edited, or copied in part) is a UserError that starts with `label`."""
        return _read_record(
            self.summary, label, SUMMARY_FIELDS, "when a run finishes: restore it, or train the run again"
        )

    def read_stopped(self, label: str) -> dict[str, Any] | None:
        """stopped.json as a dict; None when the run did not stop on request. Damage (not an object,
        no step or checkpoint) is a UserError that starts with `label`: the file only names the
        checkpoint, so deleting it loses nothing and the same command resumes from the newest one."""
        return _read_record(
            self.stopped, label, STOPPED_FIELDS, "when a run stops on request: delete it and run the same command again"
        )

    @property
    def stop_request(self) -> Path:
        return self.path / STOP_REQUEST_FILE

    @property
    def stopped(self) -> Path:
        return self.path / STOPPED_FILE

    @property
    def model(self) -> Path:
        return self.path / "model"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def reference(self) -> Path:
        """A preference run's precomputed reference log-probabilities and their record."""
        return self.path / "reference"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def tracking(self) -> Path:
        """The ids of the run's W&B and MLflow runs, so that a resumed run logs into the same ones."""
        return self.path / "tracking.json"

    @property
    def wandb(self) -> Path:
        """W&B's folder: one offline-run-* folder per start of the training (training.report_to: [wandb])."""
        return self.path / "wandb"

    @property
    def mlflow(self) -> Path:
        """The run's own MLflow store (mlflow.db and artifacts/) when no tracking URI is set."""
        return self.path / "mlflow"

    @property
    def benchmarks(self) -> Path:
        """Scores of lm-evaluation-harness tasks (evaluation.tasks, `supertune eval --tasks`), one JSON record per evaluation."""
        return self.path / "benchmarks.jsonl"

    @property
    def benchmarks_table(self) -> Path:
        """The same scores as a markdown table, rewritten after every evaluation."""
        return self.path / "benchmarks.md"

    @property
    def resolution(self) -> Path:
        """How config.yaml was resolved: the layers, the cluster profile's files and their sha256."""
        return self.path / "resolution.json"

    @property
    def base_model(self) -> Path:
        """Fresh base weights saved beside LoRA adapters trained on them."""
        return self.path / "base_model"

    @property
    def deepspeed_config(self) -> Path:
        """The DeepSpeed JSON of a zero strategy, as the run used it."""
        return self.path / "deepspeed_config.json"

    @property
    def job_script(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def jobs(self) -> Path:
        """One JSON line per SLURM submission of the run."""
        return self.path / "jobs.jsonl"

    @property
    def logs(self) -> Path:
        return self.path / LOG_DIR

    @property
    def hostfile(self) -> Path:
        """The deepspeed launcher's hosts and slots, written by the job from its allocation."""
        return self.path / "hostfile"

    @property
    def preflight_report(self) -> Path:
        """The job's pre-flight (supertune doctor --comm) report, JSON, written by its rank 0."""
        return self.path / "preflight.json"

    @property
    def accelerate_config(self) -> Path:
        """`accelerate launch`'s fixed settings, written when the job is submitted."""
        return self.path / "accelerate_config.yaml"


def _read_record(path: Path, label: str, fields: dict[str, Field], fix: str) -> dict[str, Any] | None:
    """A JSON object supertune wrote into a run directory, its fields checked (`fields`); None when
    it does not exist. `fix` says when supertune writes it and what to do about damage."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{label}: {path} cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        data, reason = None, f"not JSON: {first_line(exc)}"
    else:
        reason = f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data, dict):
        raise UserError(f"{label}: {path} is {reason}; supertune writes it {fix}")
    damage = record_damage(data, fields)
    if damage:
        raise UserError(f"{label}: {path} is damaged ({damage}); supertune writes it {fix}")
    return data


def run_of_model(model_dir: str | os.PathLike[str]) -> RunDir | None:
    """The run whose final model `model_dir` is (`<run dir>/model`), else None."""
    path = Path(model_dir).expanduser().absolute()
    run = RunDir(path.parent)
    return run if holds_run(run.path) and run.model == path else None


def holds_run(path: Path) -> bool:
    """Whether `path` is the directory of a run (it has the run's config.yaml)."""
    return (Path(path).expanduser() / CONFIG_FILE).is_file()


def create_run_dir(explicit: str | None, name: str, runs_root: str, config_text: str) -> RunDir:
    """Create the run directory and write the resolved config into it; never reuse a directory holding a run."""
    if explicit:
        # A directory of the user's own files (a model, checkpoints of another tool) is refused, not filled.
        path = make_output_dir(explicit, "--run-dir", "run (config.yaml)")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(runs_root).expanduser().absolute() / f"{name}-{stamp}"
        suffix = 1
        while os.path.lexists(path):
            suffix += 1
            path = path.with_name(f"{name}-{stamp}-{suffix}")
        path = make_output_dir(path, f"output.runs_root ({runs_root!r})", "run")
    run = RunDir(path)
    run.config.write_text(config_text, encoding="utf-8")
    return run


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
