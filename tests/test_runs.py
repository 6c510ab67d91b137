"""supertune.runs starts every run and waits for it: real training processes on this machine (killed,
resumed, found finished), real jobs in the Slurm test cluster's queue (submitted, refused or kept
while queued, waited for), and the table of internal entry points that every command line uses."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_fixtures import TINY_JOB
from supertune.entry import ENTRY_POINTS

SRC = Path(__file__).resolve().parent.parent / "src" / "supertune"
TINY = [
    *TINY_JOB,
    "training.max_steps=6",
    "training.save_steps=2",
]


# -- the entry points -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_entry_point_answers_its_help_with_argparse(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "supertune.entry", name, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m supertune.entry {name} ")


def test_an_unknown_entry_point_is_one_line_naming_the_choices() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "supertune.entry", "train_worker", "/tmp/x"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "invalid choice: 'train_worker' (choose from 'train-worker'" in proc.stderr


def test_users_help_shows_no_entry_point() -> None:
    from supertune.cli.main import COMMANDS

    for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
        out = subprocess.run(
            [sys.executable, "-m", "supertune", *argv], capture_output=True, text=True, timeout=60
        ).stdout
        assert "supertune.entry" not in out and not any(name in out for name in ENTRY_POINTS), argv
        if argv[0] == "prepare":
            assert "--part" not in out and "--work" not in out and "--merge" not in out


def _imports(path: Path) -> set[str]:
    """supertune modules a file imports (relative imports made absolute)."""
    package = ".".join(["supertune", *path.parent.relative_to(SRC).parts])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{module}.{a.name}" for a in node.names} | {module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("supertune")}


def test_runs_imports_only_downwards() -> None:
    above = ("supertune.cli", "supertune.federation", "supertune.telemetry.sweep", "supertune.sweeps")
    for path in sorted((SRC / "runs").glob("*.py")):
        assert not [m for m in _imports(path) if m.startswith(above)], path.name


def test_no_module_starts_supertunes_own_cli_or_names_a_worker_module() -> None:
    """Processes of supertune's own start through the entry table, never as `python -m supertune CMD`."""
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert '"-m", "supertune"' not in text, path
        if path.name != "entry.py":
            for module in {e.module for e in ENTRY_POINTS.values()}:
                assert f'"{module}"' not in text, (path, module)


# -- local runs ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_run_killed_resumes_and_is_then_found_finished(tmp_path: Path) -> None:
    from supertune.resolve import resolve
    from supertune.runs.local import train_logged

    run, log = tmp_path / "run", tmp_path / "train.log"
    resolution = resolve(None, [*TINY, f"output.runs_root={tmp_path}"])
    killed = train_logged(resolution, run, log, env={"SUPERTUNE_FAULT": "step@4"})
    assert killed.code != 0 and killed.exit_code == killed.code and killed.summary is None
    assert (run / "checkpoints").is_dir() and "supertune: run dir " in log.read_text()

    resumed = train_logged(resolution, run, log)
    assert resumed.exit_code == 0, log.read_text()[-3000:]
    assert (
        resumed.summary is not None
        and resumed.summary["train_steps"] == 6
        and resumed.summary["resumed_from_step"] == 2
    )  # killed before step 4's save
    text = log.read_text()
    assert (
        f"resuming the run in {run}" in text and text.count("supertune: rank 0 of 1 ") == 2
    )  # the worker's line, twice

    again = train_logged(resolution, run, log)
    assert again.exit_code == 0 and again.summary == resumed.summary
    text = log.read_text()
    assert (
        "has already finished; nothing to resume" in text and text.count("supertune: rank 0 of 1 ") == 2
    )  # nothing started
    with pytest.raises(Exception, match="--no-resume was given"):
        train_logged(resolution, run, log, no_resume=True)


# -- SLURM runs ---------------------------------------------------------------------------------------


@pytest.fixture
def slurm_env(slurm_client: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process as a user of the test cluster: supertune.runs asks Slurm's commands in-process."""
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
        monkeypatch.delenv(key)
    for key, value in slurm_client.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return slurm_client


def test_the_wait_loop_hands_back_each_job_as_it_ends(slurm_single, slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A job is handed back as soon as it has ended, while another still runs. The slow job cannot end
    before the failing one has been handed back: it waits for a gate that is opened only then. So the
    order holds however loaded the machine is, and a loop that handed the jobs back only once all had
    ended would meet the slow job's own limit (it then ends FAILED) instead."""
    import shlex

    from supertune.runs.wait import wait_for_jobs

    gate = tmp_path / "gate"
    wait_for_gate = f"for i in $(seq 600); do [ -e {shlex.quote(str(gate))} ] && exit 0; sleep 0.5; done; exit 1"
    failing = slurm_single.sbatch(None, "--wrap", "exit 3", f"--output={tmp_path}/failing.out")
    slow = slurm_single.sbatch(None, "--wrap", wait_for_gate, f"--output={tmp_path}/slow.out")
    seen: list[tuple[str, str]] = []
    waiting = wait_for_jobs(
        {"slow": str(slow), "failing": str(failing)}, 1, lambda key, state: seen.append((key, state.state))
    )
    first = next(waiting)
    gate.touch()
    ended = [first, *waiting]
    assert [(key, state.state) for key, state in ended] == [("failing", "FAILED"), ("slow", "COMPLETED")]
    assert ("failing", "FAILED") in seen and ("slow", "COMPLETED") in seen
    assert len(seen) == len(set(seen))  # each state a job is in is heard once


def test_a_queued_run_is_refused_or_its_job_kept(slurm_single, slurm_env: dict[str, str], tmp_path: Path) -> None:
    from supertune.errors import UserError
    from supertune.resolve import resolve
    from supertune.runs.slurm import start_slurm
    from supertune.runs.wait import wait_for_jobs
    from supertune.slurm.jobs import job_records

    run = tmp_path / "run"
    resolution = resolve(
        None, [*TINY, "launch.cluster=local", "launch.launcher=srun", "launch.procs_per_node=1", "slurm.time=00:10:00"]
    )
    first = start_slurm(resolution, str(run))
    assert first.job_id and first.job_id.isdigit() and not first.kept and first.choice.resumed is False
    assert [r.job_id for r in job_records(first.run)] == [first.job_id]  # recorded in the run's jobs.jsonl
    try:
        with pytest.raises(
            UserError, match=rf"--run-dir: job {first.job_id} of this run is still [A-Z]+; it resumes by itself"
        ):
            start_slurm(resolution, str(run))
        kept = start_slurm(resolution, str(run), if_queued="keep")
        assert (kept.job_id, kept.kept, kept.script) == (first.job_id, True, None)
        assert [r.job_id for r in job_records(first.run)] == [first.job_id]  # nothing submitted twice
    finally:
        slurm_single.scancel(int(first.job_id))
    [(key, state)] = list(wait_for_jobs({"run": first.job_id}, 1))
    assert state.finished
    again = start_slurm(resolution, str(run))  # the job has ended: the run is submitted again and resumes
    assert again.choice.resumed and again.job_id not in (None, first.job_id)
    slurm_single.scancel(int(again.job_id))
