"""Garbage in the launch environment and in a profile's container words: one line naming the
variable (or key), its value and who sets it, never a traceback and never a job that dies in the
queue; a huge --shards is refused or rendered without allocating per task."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supertune.cli.main import main
from supertune.launch.environment import LaunchVariableError, launch_environment, slurm_allocation

STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}

# (variables, the variable the error names, who sets it)
GARBAGE = [
    ({"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "abc"}, "SLURM_GPUS_ON_NODE='abc'", "Slurm"),
    ({"SLURM_JOB_ID": "7", "SLURM_GPUS_PER_NODE": "gpu:garbage"}, "SLURM_GPUS_PER_NODE='gpu:garbage'", "Slurm"),
    ({"SLURM_JOB_ID": "7", "SLURM_GPUS_PER_NODE": "a100:2,v100:"}, "SLURM_GPUS_PER_NODE='a100:2,v100:'", "Slurm"),
    ({**STEP, "SLURM_PROCID": "x"}, "SLURM_PROCID='x'", "Slurm"),
    ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'", "torchrun"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0'", "torchrun"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1'", "torchrun"),
    ({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "node[1-"}, "SLURM_NODELIST='node[1-'", "Slurm"),
    ({**STEP, "SLURM_JOB_NODELIST": "node[1-"}, "SLURM_JOB_NODELIST='node[1-'", "Slurm"),
    ({"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "2(x"}, "SLURM_TASKS_PER_NODE='2(x'", "Slurm"),
    ({**STEP, "SLURM_TASKS_PER_NODE": "2(x"}, "SLURM_TASKS_PER_NODE='2(x'", "Slurm"),
    ({"SLURM_JOB_ID": "7;rm"}, "SLURM_JOB_ID='7;rm'", "Slurm"),
    ({"OMPI_COMM_WORLD_RANK": "a", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='a'", "Open MPI"),
    ({"RANK": "0", "WORLD_SIZE": "2", "CROSS_SIZE": "z"}, "CROSS_SIZE='z'", "deepspeed launcher"),
]


@pytest.mark.parametrize(("env", "named", "setter"), GARBAGE, ids=[g[1] for g in GARBAGE])
def test_a_garbage_launch_variable_is_one_line_naming_it_and_its_launcher(env, named, setter) -> None:
    with pytest.raises(LaunchVariableError) as caught:
        launch_environment(env)
        slurm_allocation(env)
    message = str(caught.value)
    assert message.startswith(named + " in the environment is not ")
    assert setter in message and "\n" not in message


def test_sound_variables_still_read_as_before() -> None:
    env = {
        **STEP,
        "SLURM_NTASKS": "6",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_JOB_NODELIST": "n[1-3]",
    }
    view = launch_environment(env)
    assert (view.world_size, view.local_world_size, view.master_addr, view.job_id) == (6, 2, "n1", "7")
    assert launch_environment({**env, "SLURM_NODEID": "2"}).local_world_size == 1
    assert slurm_allocation(env).nodelist == "n[1-3]"


@pytest.mark.parametrize("command", [["env"], ["doctor"], ["train", "training.max_steps=1"]])
def test_commands_answer_garbage_in_one_line(command: list[str], tmp_path: Path) -> None:
    env = dict(os.environ, RANK="0", WORLD_SIZE="abc")
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", *command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "supertune: error: WORLD_SIZE='abc' in the environment is not a whole number of at least 1; torchrun "
        "(also under accelerate and the deepspeed launcher) sets it: unset it, or start supertune through that launcher"
    ]


def test_a_cache_variable_naming_a_file_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "afile").write_text("x")
    for value in (tmp_path / "afile", tmp_path / "afile" / "below"):
        monkeypatch.setenv("SUPERTUNE_CACHE", str(value))
        assert main(["train", "training.max_steps=1", f"output.runs_root={tmp_path / 'runs'}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"supertune: error: SUPERTUNE_CACHE={str(value)!r}: ")
        assert "not a directory; point it at a directory, or unset it" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_doctor_refuses_a_bandwidth_that_is_not_a_positive_number(value: str, capsys) -> None:
    assert main(["doctor", "--comm", "--expect-gbps", value]) == 2
    assert f"--expect-gbps: must be a positive number of GB/s, e.g. 20, got {float(value)}" in capsys.readouterr().err


PROFILES = [
    ('extra_args: ["--env=X=$name"]', "container.extra_args[0]: '--env=X=$name' refers to $name"),
    ('binds: ["/scratch/${name}"]', "container.binds[0]: '/scratch/${name}' refers to $name"),
    ('extra_args: ["--a=${X:-y}"]', "container.extra_args[0]: '--a=${X:-y}' has a $ that is not a $NAME"),
    ('image: "/img/a\\0b.sif"', "container.image: '/img/a\\x00b.sif' holds a NUL byte"),
    ('binds: ["/scratch\\0/x"]', "container.binds[0]: '/scratch\\x00/x' holds a NUL byte"),
    ('extra_args: ["--x\\0"]', "container.extra_args[0]: '--x\\x00' holds a NUL byte"),
]


@pytest.mark.parametrize(("container", "expected"), PROFILES)
def test_container_words_the_job_could_not_run_are_refused(
    container: str, expected: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    (tmp_path / "cfg" / "clusters").mkdir(parents=True)
    (tmp_path / "cfg" / "clusters" / "lumi.yaml").write_text(textwrap.dedent(f"container:\n  {container}\n"))
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["submit", "--dry-run", "--cluster", "lumi", "--run-dir", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and expected in err
    assert not (tmp_path / "run").exists()


def test_container_references_of_environment_variables_still_pass(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "cfg" / "clusters").mkdir(parents=True)
    (tmp_path / "cfg" / "clusters" / "lumi.yaml").write_text(
        'container:\n  image: "/img/${USER}/st.sif"\n  binds: ["/scratch/$USER"]\n'
    )
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["submit", "--dry-run", "--cluster", "lumi", "--run-dir", str(tmp_path / "run")]) == 0
    assert '"/scratch/${USER}"' in capsys.readouterr().out


def test_a_huge_shard_count_is_refused_or_rendered_without_a_list(tmp_path: Path) -> None:
    def prepare(shards: int) -> subprocess.CompletedProcess[str]:
        # The child may use 1 GiB at most: a list of the tasks would not fit (4 million ints and their text).
        return subprocess.run(
            [sys.executable, "-m", "supertune", "prepare", "--out", str(tmp_path / "store"), "--submit",
             "--cluster", "lumi", "--shards", str(shards), "--dry-run"],
            capture_output=True, text=True, timeout=120,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
        )  # fmt: skip

    proc = prepare(100_000_000)
    assert proc.returncode == 2
    assert proc.stderr.startswith("supertune: error: --shards: 100000000 array tasks are more than Slurm can run")
    proc = prepare(4_000_001)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --array=0-4000000\n" in proc.stdout


def test_a_run_refuses_a_tmpdir_compilers_cannot_write_into(tmp_path: Path, monkeypatch, capsys) -> None:
    """The doctor's tmpdir check before the run starts: one line naming TMPDIR, its value and the fix,
    and no run directory left behind."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    assert main(["train", "training.max_steps=1", f"output.runs_root={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"supertune: error: tmpdir: TMPDIR={str(tmp_path / 'missing')!r} does not exist: compilers (Triton's and "
        "DeepSpeed's kernel builds) and tools such as mktemp cannot create their temporary files there; fix: point "
        "TMPDIR at a writable directory (node-local scratch; mkdir -p it first), or unset it (supertune doctor checks "
        "the rest of the node)"
    ]
    assert not (tmp_path / "runs").exists()


def test_every_training_process_refuses_such_a_tmpdir(tmp_path: Path) -> None:
    """A job's processes check their own node (TMPDIR is the node's, not the submitting machine's)
    before they read the run: the same line, exit code 2."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "missing")}
    proc = subprocess.run(
        [sys.executable, "-m", "supertune.entry", "train-worker", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"supertune: error: tmpdir: TMPDIR={str(tmp_path / 'missing')!r} does not exist: compilers")
    )
