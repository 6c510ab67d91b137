"""The launcher table is the only place that knows the launchers: a record added to it is a choice
of `submit --launcher` and launch.launcher, is documented, and renders into a job script."""

from __future__ import annotations

import dataclasses

import pytest

from supertune.clusters import load_profile
from supertune.launch import launchers
from supertune.launch.launchers import Launcher, StepPlan


def _mpirun(p: StepPlan) -> list[object]:
    return ["mpirun", "-np", str(p.world_size), *p.python, "-m", p.module, *p.module_args]


@pytest.fixture()
def with_mpirun(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Launcher:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "no-user-config"))
    record = Launcher("mpirun", "mpirun starts every process over the allocation", _mpirun)
    monkeypatch.setitem(launchers.LAUNCHERS, record.name, record)
    return record


def test_a_new_record_is_a_choice_everywhere(with_mpirun, capsys):
    from supertune.cli.main import build_parser, main
    from supertune.config.docs import keys_reference
    from supertune.resolve import resolve_run_config

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "--help"])
    assert "{torchrun,accelerate,deepspeed,srun,mpirun}" in capsys.readouterr().out
    assert resolve_run_config(None, ["launch.launcher=mpirun"]).launch.launcher == "mpirun"
    assert "launch.launcher (torchrun | accelerate | deepspeed | srun | mpirun; default torchrun)" in keys_reference()
    assert main(["config", "show", "launch.launcher=mpirunn"]) == 2
    assert (
        "launch.launcher: 'mpirunn' is not one of torchrun, accelerate, deepspeed, srun, mpirun (did you mean mpirun?)"
        in capsys.readouterr().err
    )


def test_a_new_record_renders(with_mpirun):
    from supertune.resolve import resolve_run_config
    from supertune.slurm.job import job_spec
    from supertune.slurm.script import render_sbatch

    profile = load_profile("local")
    cfg = resolve_run_config(None, ["launch.launcher=mpirun", "launch.nodes=2", "launch.procs_per_node=2"])
    job = job_spec(cfg, profile, "/runs/x", "/venv/bin/python")
    script = render_sbatch(job, profile)
    assert "#SBATCH --ntasks-per-node=1" in script  # one agent per node, as the record says
    assert (
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=2 mpirun -np 4 /venv/bin/python -m supertune.entry train-worker /runs/x &"
        in script
    )
    one_per_process = dataclasses.replace(with_mpirun, one_task_per_process=True)
    launchers.LAUNCHERS["mpirun"] = one_per_process
    assert "#SBATCH --ntasks-per-node=2" in render_sbatch(job, profile)


def test_unknown_launcher_names_are_refused_by_submit(capsys):
    from supertune.cli.main import main

    with pytest.raises(SystemExit):
        main(["submit", "--launcher", "mpirun", "--dry-run"])
    assert "invalid choice: 'mpirun'" in capsys.readouterr().err
