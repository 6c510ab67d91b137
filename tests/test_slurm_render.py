"""Job scripts without a cluster: golden files per launcher and profile, bash -n and shellcheck on
every one, hostile values that are either refused (one line naming the field) or run nothing when
the script executes, and a `submit --dry-run` that prints only the script, fast and without torch.

SUPERTUNE_UPDATE_GOLDEN=1 rewrites the golden files from the current renderer (then review the diff).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from supertune.clusters import load_profile
from supertune.clusters.schema import ClusterProfile
from supertune.errors import UserError
from supertune.resolve import resolve_run_config
from supertune.slurm.job import JobSpec, job_spec
from supertune.slurm.script import render_sbatch, step_words
from supertune.slurm.shell import Expand

GOLDEN = Path(__file__).resolve().parent / "golden" / "sbatch"
UPDATE = os.environ.get("SUPERTUNE_UPDATE_GOLDEN", "") not in ("", "0")
RUN_DIR = "/scratch/runs/golden-20260101-000000"
PYTHON = "/opt/supertune/venv/bin/python"
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "srun")
# lumi-sif: LUMI with a container image set, so that the container prefix is pinned too;
# leonardo-preflight: Leonardo with the doctor's pre-flight step before training.
PROFILES = ("local", "lumi", "leonardo", "twcc", "lumi-sif", "leonardo-preflight")
CASES = [(p, launcher) for p in PROFILES for launcher in LAUNCHERS]


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tester's own cluster profiles must not change what is rendered."""
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "no-user-config"))


def _profile(name: str) -> ClusterProfile:
    name = name.removesuffix("-preflight")
    if name == "lumi-sif":
        lumi = load_profile("lumi")
        image = "/project/project_465000000/${USER}/supertune-lumi.sif"
        return dataclasses.replace(lumi, container=dataclasses.replace(lumi.container, image=image))
    return load_profile(name)


def _render(profile_name: str, launcher: str) -> str:
    cluster = {"lumi-sif": "lumi", "leonardo-preflight": "leonardo"}.get(profile_name, profile_name)
    overrides = [f"launch.cluster={cluster}", "launch.nodes=2", f"launch.launcher={launcher}", "output.name=golden"]
    if profile_name.endswith("-preflight"):
        overrides += ["slurm.preflight=true", "slurm.preflight_gbps=20"]
    if cluster == "local":
        overrides.append("launch.procs_per_node=2")
    profile = _profile(profile_name)
    return render_sbatch(job_spec(resolve_run_config(None, overrides), profile, RUN_DIR, PYTHON), profile)


@pytest.mark.parametrize(("profile", "launcher"), CASES, ids=[f"{p}-{launcher}" for p, launcher in CASES])
def test_script_matches_its_golden_file(profile: str, launcher: str) -> None:
    path = GOLDEN / f"{profile}-{launcher}.sbatch"
    text = _render(profile, launcher)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with SUPERTUNE_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(encoding="utf-8"), (
        f"rendering changed; SUPERTUNE_UPDATE_GOLDEN=1 rewrites {path.name}"
    )


def test_no_stale_golden_files() -> None:
    expected = {f"{p}-{launcher}.sbatch" for p, launcher in CASES}
    assert {p.name for p in GOLDEN.glob("*.sbatch")} == expected


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    reason = "shellcheck not installed (tests/cluster/install.sh installs it)"
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason}, and CI is set", pytrace=False)
    pytest.skip(reason)


@pytest.mark.parametrize(("profile", "launcher"), CASES, ids=[f"{p}-{launcher}" for p, launcher in CASES])
def test_script_passes_bash_n_and_shellcheck(profile: str, launcher: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(_render(profile, launcher), encoding="utf-8")
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run(
        [_shellcheck(), "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _srun_line(script: str) -> str:
    """The training step's command line (after the step that makes node_dirs, if any)."""
    return next(line for line in script.splitlines() if line.startswith("srun ") and " mkdir " not in line)


def test_golden_facts() -> None:
    """A few facts the golden files hold, stated where a reader sees them."""
    lumi = _render("lumi", "srun")
    assert "#SBATCH --ntasks-per-node=8" in lumi and "#SBATCH --gpus-per-node=8" in lumi
    assert "#SBATCH --cpus-per-task=7" in lumi and "--cpus-per-task=7 " in _srun_line(lumi)
    # MIOpen's node-local directories (node_dirs) are made on every node before any process starts
    made = 'mkdir -p -- "${MIOPEN_USER_DB_PATH}" "${MIOPEN_CUSTOM_CACHE_DIR}"'
    assert lumi.index(made) < lumi.index(_srun_line(lumi)) and lumi.index("export MIOPEN_USER_DB_PATH=") < lumi.index(
        made
    )
    torchrun = _render("leonardo", "torchrun")
    assert "#SBATCH --ntasks-per-node=1" in torchrun and "#SBATCH --cpus-per-task=32" in torchrun
    assert "--nproc-per-node=4" in torchrun
    local = _render("local", "deepspeed")
    assert "export OMP_NUM_THREADS=1" in local and 'export DS_ACCELERATOR="cpu"' in local
    assert "slots=2" in local and "--no_ssh" in local
    sif = _srun_line(_render("lumi-sif", "torchrun"))
    assert 'singularity exec --rocm --bind "/project,/scratch,' in sif
    assert '"/project/project_465000000/${USER}/supertune-lumi.sif" python3 -m torch.distributed.run' in sif


# ---- hostile values ---------------------------------------------------------------------------

# Everything a shell could act on: command substitution both ways, both quotes, ;, #, spaces, a
# backslash, a glob, a % (Slurm's log name patterns) and a reference-looking $.
TRICKS = "a $(touch {m}) `touch {m}` ; touch {m} ; 'single' \"double\" # hash * %x $ {{x}}"


def _base_job(**changes: object) -> JobSpec:
    job = JobSpec(
        name="base",
        run_dir="/tmp/run",
        launcher="torchrun",
        nodes=2,
        procs_per_node=2,
        gpus_per_node=0,
        cpus_per_proc=1,
        time="00:10:00",
        partition=None,
        account=None,
        qos=None,
        mem=None,
        exclusive=False,
        extra_args=(),
        python="/usr/bin/python3",
        master_port=None,
    )
    return dataclasses.replace(job, **changes)


def test_each_job_says_what_it_is() -> None:
    """A run's job, the benchmarks of a saved model and a federated site's evaluation all render through
    render_sbatch: each script's first lines say which of them it is and where it comes from."""
    from supertune.benchmarks.job import BenchmarkJob, benchmark_job
    from supertune.federation.rounds.site_jobs import evaluation_job

    cfg = resolve_run_config(None, ["launch.cluster=local", "output.name=r"], trains=False)
    profile = ClusterProfile()
    bench = BenchmarkJob("/runs/r/model", ("supertune_corpus",), None, 8, "auto")
    heads = {
        kind: render_sbatch(job, profile).splitlines()[1:3]
        for kind, job in (
            ("run", _base_job(run_dir="/runs/r")),
            ("benchmarks", benchmark_job(cfg, profile, Path("/runs/r/benchmarks-job"), bench, "python3")),
            (
                "evaluation",
                evaluation_job(cfg, profile, Path("/fed/round-002/leo/evaluate"), "leo-eval", ("a", "b", "c")),
            ),
        )
    }
    assert heads == {
        "run": [
            "# Job script of the supertune run in /runs/r.",
            "# Rendered from the run's config.yaml; render it again (supertune submit --dry-run) rather than edit it.",
        ],
        "benchmarks": [
            "# Job script of the benchmarks of a saved model (supertune eval MODEL --tasks ... --submit), with its logs in "
            "/runs/r/benchmarks-job.",
            "# Rendered from the model's run config and the command's options; render it again (the same command "
            "with --dry-run) rather than edit it.",
        ],
        "evaluation": [
            "# Job script of a federated site's evaluation of the round's global model (supertune federate), in "
            "/fed/round-002/leo/evaluate.",
            "# Rendered by the federation from the site's run config, again for every round: change the site's "
            "config, not this file.",
        ],
    }


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("output.name", {"name": "two\nlines"}),
        ("--run-dir", {"run_dir": "/tmp/two\nlines"}),
        ("--run-dir", {"run_dir": "/tmp/back\\slash"}),
        ("slurm.partition", {"partition": "gpu\n#SBATCH --account=other"}),
        ("slurm.account", {"account": "acc\r"}),
        ("slurm.extra_args", {"extra_args": ("--comment=a\nb",)}),
    ],
)
def test_values_a_header_cannot_hold_are_refused_naming_the_field(field: str, changes: dict[str, object]) -> None:
    with pytest.raises(UserError) as info:
        render_sbatch(_base_job(**changes), ClusterProfile())
    message = str(info.value)
    assert message.startswith(f"{field}: ") and "\n" not in message


def test_bad_env_names_are_refused_naming_the_variable() -> None:
    for name in ("BAD NAME", "1X", "X;touch", "é"):
        with pytest.raises(UserError, match=r"^env\.") as info:
            render_sbatch(_base_job(), ClusterProfile(env={name: "1"}))
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("slurm.partition=gpu;$(touch {m})", "slurm.partition"),
        ("slurm.account=`touch {m}`", "slurm.account"),
        ("slurm.qos=normal high", "slurm.qos"),
        ("slurm.mem=$(touch {m})G", "slurm.mem"),
        ("output.name=two\nlines", "output.name"),
    ],
)
def test_submit_refuses_bad_scheduler_values_in_one_line_and_writes_nothing(
    override: str, field: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    proc = _supertune("submit", "--dry-run", "--run-dir", str(run_dir), override.format(m=marker), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], proc.stderr
    assert not run_dir.exists() and not marker.exists()


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/bash\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _stubs(directory: Path, record: Path) -> None:
    """srun, scontrol, module and a container runtime that write their argv (NUL-separated) under `record`."""
    directory.mkdir(parents=True)
    save = f'printf "%s\\0" "$@" > "{record}/$(basename "$0").argv"\n'
    # srun: record, then run the command after srun's own options on "node 0", like a real step.
    _stub(directory, "srun", save + 'while [[ "$1" == --* ]]; do shift; done\nexport SLURM_NODEID=0\nexec "$@"\n')
    _stub(directory, "scontrol", '[ "$1 $2" = "show hostnames" ] && printf "node1\\nnode2\\n"\n')
    _stub(directory, "module", save)
    _stub(directory, "singularity", save + f'env -0 > "{record}/singularity.env"\n')


def _python_stub(path: Path, record: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(
        f'#!/bin/bash\nprintf "%s\\0" "$@" > "{record}/python.argv"\nenv -0 > "{record}/python.env"\n', encoding="utf-8"
    )
    path.chmod(0o755)


def _read_argv(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def _read_env(path: Path) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in path.read_bytes().decode().split("\0") if "=" in item)
    return dict(pairs)


def _expected_step(job: JobSpec, profile: ClusterProfile, env: dict[str, str]) -> list[str]:
    """The step's words as the processes must receive them: per-node references resolved."""
    words = step_words(job, profile)

    def resolve(word: object) -> str:
        if isinstance(word, Expand):
            return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env[m.group(1)], word.text)
        return str(word)

    return [resolve(w) for w in words]


def _execute(script: str, tmp_path: Path, stub_dir: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    env = {
        "PATH": f"{stub_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USER": "alice",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
    }
    return subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_hostile_values_reach_the_processes_exactly_and_run_nothing(launcher: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    tricks = TRICKS.format(m=marker)
    record = tmp_path / "record"
    record.mkdir()
    stubs = tmp_path / "stubs"
    _stubs(stubs, record)
    # The marker's own slashes make these nested directories, which is fine: they are paths.
    run_dir = tmp_path / f"run {tricks}"
    run_dir.mkdir(parents=True)
    python = tmp_path / f"py {tricks}" / "python"
    _python_stub(python, record)
    hostile_env = {"HOSTILE": tricks + " \\ end", "WITH_REF": "${HOME}/cache $USER", "NEWLINE": "one\ntwo"}
    profile = ClusterProfile(name="hostile", modules=["LUMI/24.03", "partition/G"], module_purge=True, env=hostile_env)
    job = _base_job(
        name=f"name {tricks}",
        run_dir=str(run_dir),
        launcher=launcher,
        python=str(python),
        partition=f"p {tricks}",
        account=f"acc {tricks}",
        qos=f"q {tricks}",
        mem=f"m {tricks}",
        extra_args=(f"--comment={tricks}",),
    )
    script = render_sbatch(job, profile)
    proc = _execute(script, tmp_path, stubs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists(), "a value was executed"

    step_env = {
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NUM_NODES": "2",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": str(10000 + 1234 % 20000),
    }
    argv = _read_argv(record / "python.argv")
    assert [str(python), *argv] == _expected_step(job, profile, step_env)
    assert argv[-1] == str(run_dir)
    env = _read_env(record / "python.env")
    assert env["HOSTILE"] == hostile_env["HOSTILE"] and env["NEWLINE"] == "one\ntwo"
    assert env["WITH_REF"] == f"{tmp_path}/cache alice"
    assert env["SUPERTUNE_RUN_DIR"] == str(run_dir) and env["OMP_NUM_THREADS"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node1", step_env["MASTER_PORT"])
    srun = _read_argv(record / "srun.argv")
    assert srun[:4] == [
        "--kill-on-bad-exit=1",
        f"--ntasks-per-node={job.tasks_per_node}",
        f"--cpus-per-task={job.cpus_per_task}",
        "bash" if launcher in ("accelerate", "deepspeed") else str(python),
    ]
    assert _read_argv(record / "module.argv") == ["load", "LUMI/24.03", "partition/G"]  # after `module purge`
    if launcher == "deepspeed":
        assert (run_dir / "hostfile").read_text() == "node1 slots=2\nnode2 slots=2\n"


def test_container_paths_expand_their_variables_and_nothing_else(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    record = tmp_path / "record"
    record.mkdir()
    stubs = tmp_path / "stubs"
    _stubs(stubs, record)
    container = dataclasses.replace(
        ClusterProfile().container,
        runtime="singularity",
        image="/images/${USER}/st.sif",
        binds=["/scratch", "/project/$USER"],
        extra_args=[f"--env=X=$(touch {marker})"],
    )
    profile = ClusterProfile(name="c", gpu_vendor="amd", gpus_per_node=8, container=container)
    job = _base_job(launcher="deepspeed", python="python3", run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    proc = _execute(render_sbatch(job, profile), tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    argv = _read_argv(record / "singularity.argv")
    assert argv[:6] == [
        "exec",
        "--rocm",
        "--bind",
        "/scratch,/project/alice",
        f"--env=X=$(touch {marker})",
        "/images/alice/st.sif",
    ]
    assert argv[6:9] == ["python3", "-m", "deepspeed.launcher.runner"]
    assert not marker.exists()


def test_sbatch_header_values_follow_sbatchs_own_reading() -> None:
    """sbatch strips quotes, honours backslash escapes even inside quotes, ends a value at a blank and
    starts a comment at #: checked against real sbatch on the test cluster (see test_slurm_lifecycle)."""
    script = render_sbatch(_base_job(name="it\"s a 'name' #1 \\ %x", run_dir="/tmp/100% done"), ClusterProfile())
    assert '#SBATCH --job-name="it\\"s a \'name\' #1 \\\\ %x"' in script
    assert '#SBATCH --output="/tmp/100%% done/logs/%x-%j.out"' in script


# ---- the CLI without torch --------------------------------------------------------------------

HEAVY = ("torch", "transformers", "accelerate", "deepspeed", "datasets", "numpy")
PROBE = """
import json, sys
from supertune.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
sys.stderr.write("PROBE " + json.dumps({"code": code, "heavy": heavy}) + "\\n")
""" % (HEAVY,)  # noqa: UP031 (the probe's own source is full of braces)
"""What keeps --help and --dry-run instant is what they do not import, checked here; no time is asserted
(a loaded machine would fail it)."""


def _supertune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supertune", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _probe(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    line = [x for x in proc.stderr.splitlines() if x.startswith("PROBE ")][-1]
    return proc, json.loads(line[len("PROBE ") :])


def test_dry_run_prints_only_the_script_without_torch(tmp_path: Path) -> None:
    # What keeps it fast (about 0.2 s) is what it does not import: torch, transformers, datasets.
    run_dir = tmp_path / "run"
    proc, probe = _probe(
        ["submit", "--dry-run", "--run-dir", str(run_dir), "--nodes", "2", "--launcher", "deepspeed"], tmp_path
    )
    assert probe["code"] == 0 and probe["heavy"] == [], probe
    assert proc.stdout == (run_dir / "job.sbatch").read_text()
    assert proc.stdout.startswith("#!/bin/bash\n") and "nothing submitted" not in proc.stdout


@pytest.mark.parametrize("command", ["submit", "status", "logs", "cancel"])
def test_help_is_without_torch(command: str, tmp_path: Path) -> None:
    proc, probe = _probe([command, "--help"], tmp_path)
    assert probe["code"] == 0 and probe["heavy"] == [], probe
    assert proc.stdout.startswith(f"usage: supertune {command}")
