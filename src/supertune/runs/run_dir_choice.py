"""Which run directory a run that starts writes to (`train`, `submit`, a sweep's scale, a federated
site's round): a new one, or the unfinished run that --run-dir names (resumed from its checkpoints
with the same settings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..rundir import RunDir, create_run_dir, holds_run

__all__ = ["RunDirChoice", "choose_run_dir"]


@dataclass(frozen=True)
class RunDirChoice:
    run: RunDir
    resumed: bool
    finished: bool
    """The run named by --run-dir has already finished: nothing to do."""
    message: str


def choose_run_dir(run_dir: str | None, resolution: Any, no_resume: bool) -> RunDirChoice:
    """A new run dir holding the resolved config (and how it was resolved), or the run --run-dir names."""
    from ..config import dump_config, load_saved_config
    from ..resolve import write_resolution

    cfg = resolution.config
    config_text = dump_config(cfg)
    if not (run_dir and holds_run(Path(run_dir))):
        run = create_run_dir(run_dir, cfg.output.name, cfg.output.runs_root, config_text)
        write_resolution(run, resolution)
        return RunDirChoice(run, resumed=False, finished=False, message=f"run dir {run.path}")
    from ..checkpoints.layout import CheckpointDir
    from ..train.lifecycle.resume import config_differences

    run = RunDir(Path(run_dir).expanduser().absolute())
    if no_resume:
        raise UserError(
            f"--run-dir: {str(run.path)!r} already holds a run and --no-resume was given; choose a new directory"
        )
    # The run's config as it was resolved when the run was made: no layer is applied to it again.
    differences = config_differences(load_saved_config(run.config), cfg)
    if differences:
        raise UserError(
            f"--run-dir: {str(run.path)!r} holds a run with other settings, so it cannot continue with these "
            f"({'; '.join(differences)}); use the run's own settings (its config.yaml) or a new --run-dir"
        )
    if run.summary.exists():
        return RunDirChoice(
            run, resumed=False, finished=True, message=f"the run in {run.path} has already finished; nothing to resume"
        )
    if run.config.read_text(encoding="utf-8") != config_text:
        run.config.write_text(config_text, encoding="utf-8")  # only keys a resumed run may change differ
        write_resolution(run, resolution)
    latest = CheckpointDir(run.checkpoints).latest()
    start = (
        f"its latest good checkpoint ({latest.name} is the newest)"
        if latest
        else "the start (no checkpoint was saved yet)"
    )
    return RunDirChoice(run, resumed=True, finished=False, message=f"resuming the run in {run.path} from {start}")
