"""scripts/env.sh --print: the PyTorch build chosen for each SUPERTUNE_TORCH value (and why), where the
venv goes, and the pip commands, with nothing downloaded; the CPU path (what CI installs) as before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def _print(repo: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if k not in ("SUPERTUNE_TORCH", "SUPERTUNE_VENV")}
    merged.update(env)
    return subprocess.run(
        ["bash", str(repo / "scripts" / "env.sh"), "--print"],
        env=merged,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def _pip_torch(out: str) -> str:
    return next(line for line in out.splitlines() if "pip install torch==" in line)


def _machine() -> str:
    return subprocess.run(["uname", "-m"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("build", ["cu126", "cu128", "rocm6.4"])
def test_a_gpu_build_comes_from_pytorchs_index(repo: Path, tmp_path: Path, build: str) -> None:
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH=build, SUPERTUNE_VENV="/project/p123/supertune-venv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        f"supertune: PyTorch build {build} (SUPERTUNE_TORCH={build}); venv /project/p123/supertune-venv; packages: all\n"
    )
    assert (
        _pip_torch(proc.stdout)
        == f"/project/p123/supertune-venv/bin/python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/{build}"
    )
    # The other pins are the same for every build.
    assert (
        f"/project/p123/supertune-venv/bin/python -m pip install -r {repo}/src/supertune/pinned-requirements.txt"
        in proc.stdout
    )


def test_pypis_own_build_comes_from_pypi(repo: Path, tmp_path: Path) -> None:
    """PyPI's torch 2.13.0 for x86_64 is the CUDA 13.0 build: no PyTorch index is needed for cu130 there
    (a site that mirrors only PyPI can install it); on aarch64 PyPI's wheel is a CPU build."""
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH="cu130")
    assert proc.returncode == 0, proc.stderr
    if _machine() == "x86_64":
        assert _pip_torch(proc.stdout) == f"{repo}/.venv/bin/python -m pip install torch==2.13.0"
    else:
        assert _pip_torch(proc.stdout).endswith("--index-url https://download.pytorch.org/whl/cu130")


def test_the_cpu_path_is_unchanged(repo: Path, tmp_path: Path) -> None:
    """The CPU wheel pip's own indexes offer (the CI machines' local one), named by its label so that
    PyPI's CUDA build can never be taken instead; PyTorch's CPU index only where none is offered."""
    cases = [{"SUPERTUNE_TORCH": "cpu"}]
    if not Path("/dev/kfd").exists() and not Path("/usr/bin/nvidia-smi").exists():
        cases.append({"PATH": "/usr/bin:/bin"})  # auto, on a machine without a GPU driver (as CI's)
    for env in cases:
        proc = _print(repo, tmp_path, **env)
        assert proc.returncode == 0, proc.stderr
        pip = f"{repo}/.venv/bin/python -m pip install"
        if _machine() == "x86_64":
            assert (
                _pip_torch(proc.stdout)
                == f"{pip} torch==2.13.0+cpu || {pip} torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"
            )
        else:
            assert _pip_torch(proc.stdout) == f"{pip} torch==2.13.0"


def _fake_nvidia_smi(tmp_path: Path, driver: str, capabilities: tuple[str, ...] = ("9.0",)) -> str:
    """A PATH on which nvidia-smi lists GPUs of these compute capabilities and reports `driver` (empty: cannot say)."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        "  -L) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)' ;;\n"
        f"  *driver_version*) {'exit 9' if not driver else f'echo {driver}'} ;;\n"
        f"  *compute_cap*) printf '%s\\n' {' '.join(capabilities)} ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    return f"{fake.parent}:/usr/bin:/bin"


def test_auto_picks_the_cuda_build_the_driver_runs(repo: Path, tmp_path: Path) -> None:
    """The boundaries are doctor's: the oldest driver branch of CUDA 12 and of CUDA 13."""
    from supertune.doctor.software import MIN_DRIVER_BRANCH

    cuda12, cuda13 = MIN_DRIVER_BRANCH[12], MIN_DRIVER_BRANCH[13]
    for driver, build in (
        (f"{cuda13}.65.06", "cu130"),
        (f"{cuda13 + 10}.1", "cu130"),
        (f"{cuda13 - 1}.99", "cu128"),
        (f"{cuda12}.60.13", "cu128"),
        ("", "cu128"),
    ):
        proc = _print(repo, tmp_path, PATH=_fake_nvidia_smi(tmp_path, driver))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"supertune: PyTorch build {build} (auto: "), (driver, proc.stdout)
        if driver:
            assert f"NVIDIA driver {driver} runs CUDA" in proc.stdout
        if build == "cu128":
            assert _pip_torch(proc.stdout).endswith("--index-url https://download.pytorch.org/whl/cu128")


def test_auto_refuses_a_driver_older_than_any_build(repo: Path, tmp_path: Path) -> None:
    proc = _print(repo, tmp_path, PATH=_fake_nvidia_smi(tmp_path, "470.256.02"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "supertune: the NVIDIA driver here (470.256.02) is older than 525, the oldest that runs CUDA 12 builds;"
    )
    assert len(proc.stderr.strip().splitlines()) == 1


def test_auto_does_not_choose_for_gpus_older_than_cuda_13s(repo: Path, tmp_path: Path) -> None:
    """Volta (7.0) beside newer GPUs: CUDA 13 builds carry no kernels for it, whatever the driver."""
    proc = _print(repo, tmp_path, PATH=_fake_nvidia_smi(tmp_path, "580.65.06", ("9.0", "7.0")))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "supertune: these GPUs have compute capability 7.0, older than 7.5, where CUDA 13 builds start: auto will not choose for them;"
    )
    for newer in (("7.5",), ("8.0", "10.0")):
        proc = _print(repo, tmp_path, PATH=_fake_nvidia_smi(tmp_path, "580.65.06", newer))
        assert proc.returncode == 0 and "PyTorch build cu130" in proc.stdout, (newer, proc.stderr)


def test_a_wrong_build_name_is_one_line(repo: Path, tmp_path: Path) -> None:
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH="cuda12")
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.strip()
        == "supertune: SUPERTUNE_TORCH=cuda12 is not a PyTorch build; use cpu, cu126, cu128, cu130, rocm6.4 (a wheel index name) or auto"
    )


def _local_cpu_wheel_dirs() -> list[str]:
    """The find-links folders of pip's configuration that hold a CPU wheel of the pinned torch (the CI
    machines have one); empty where pip would have to download a build."""
    proc = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True)
    dirs = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            for folder in value.strip("'\"").split():
                if any(Path(folder).glob("torch-2.13.0+cpu-*.whl")):
                    dirs.append(folder)
    return dirs


@pytest.mark.slow
def test_a_build_other_than_asked_is_refused_after_installing(repo: Path, tmp_path: Path) -> None:
    """Asked for PyPI's CUDA build where pip's configuration offers a CPU wheel first (the CI
    machines'): the install stops with the build it got, instead of a venv that trains on the CPU."""
    if _machine() != "x86_64" or not _local_cpu_wheel_dirs():
        pytest.skip("needs pip's configuration to offer a CPU wheel of torch 2.13.0 (the CI machines' does)")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_") and k != "VIRTUAL_ENV"}
    env.update(SUPERTUNE_TORCH="cu130", SUPERTUNE_VENV=str(venv), SUPERTUNE_STREAMFLOW="0")
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "env.sh")], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"supertune: asked for PyTorch build cu130 (SUPERTUNE_TORCH=cu130), but pip installed cpu into {venv}:"
    ), proc.stderr
    assert not (venv / ".supertune-installed").exists()


def test_the_venv_never_goes_among_other_files(repo: Path, tmp_path: Path) -> None:
    """SUPERTUNE_VENV naming a file, or a directory of other files (the project directory instead of
    a new one inside it), is refused before anything is written there; a relative one is made absolute."""
    project = tmp_path / "p123"
    project.mkdir()
    (project / "notes.txt").write_text("mine\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_")}
    for venv, message in (
        (project / "notes.txt", f"supertune: SUPERTUNE_VENV={project}/notes.txt is a file, not a directory;"),
        (
            project,
            f"supertune: SUPERTUNE_VENV={project} holds other files and no venv (no pyvenv.cfg); name a new directory inside it, e.g. SUPERTUNE_VENV={project}/supertune-venv",
        ),
    ):
        proc = subprocess.run(
            ["bash", str(repo / "scripts" / "env.sh")],
            env={**env, "SUPERTUNE_VENV": str(venv)},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert (
        sorted(p.name for p in project.iterdir()) == ["notes.txt"] and (project / "notes.txt").read_text() == "mine\n"
    )
    proc = _print(repo, tmp_path, SUPERTUNE_VENV="venvs/st")
    assert proc.returncode == 0 and f"; venv {tmp_path}/venvs/st; packages: all\n" in proc.stdout


def test_print_names_the_streamflow_venv_unless_skipped(repo: Path, tmp_path: Path) -> None:
    """`bash scripts/env.sh` makes StreamFlow's venv too (a federation machine's whole environment);
    SUPERTUNE_STREAMFLOW=0 leaves it out."""
    proc = _print(repo, tmp_path, SUPERTUNE_TORCH="cpu", SUPERTUNE_STREAMFLOW_VENV="/project/sf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == [
        "python3 -m venv /project/sf",
        "/project/sf/bin/python -m pip install streamflow==0.2.0rc3",
    ]
    skipped = _print(repo, tmp_path, SUPERTUNE_TORCH="cpu", SUPERTUNE_STREAMFLOW="0")
    assert "streamflow" not in skipped.stdout


def _made_here(venv: Path, repo: Path) -> str | None:
    """The PyTorch build scripts/env.sh recorded in `venv`'s stamp for this checkout's pins, or None when
    the venv was not made by it for them (then sourcing env.sh would install into it)."""
    import hashlib

    stamp = venv / ".supertune-installed"
    if not stamp.is_file():
        return None
    pins = (repo / "src" / "supertune" / "pinned-requirements.txt").read_bytes() + (
        repo / "pyproject.toml"
    ).read_bytes()
    for build in ("cpu", "cu126", "cu128", "cu130", "rocm6.4"):
        if hashlib.sha256(pins + f"{build}\n".encode()).hexdigest() == stamp.read_text().strip():
            return build
    return None


def test_the_default_run_does_not_make_the_streamflow_venv(repo: Path, tmp_path: Path) -> None:
    """`bash scripts/train-default.sh` makes what its run needs and nothing else: not StreamFlow's venv,
    which takes about as long as the training stack and which only a StreamFlow federation uses (the
    test command, scripts/test.sh, asks for it). Run against this test's own venv, which env.sh
    reuses as it is (its stamp matches), with --help as the run."""
    import sys

    venv = Path(sys.prefix)
    build = _made_here(venv, repo)
    if build is None:
        pytest.skip(f"{venv} was not made by scripts/env.sh for these pins: sourcing env.sh would install into it")
    sf = tmp_path / "sf-venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_")}
    env.update(SUPERTUNE_VENV=str(venv), SUPERTUNE_TORCH=build, SUPERTUNE_STREAMFLOW_VENV=str(sf))
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "train-default.sh"), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: supertune train")
    assert not sf.exists(), proc.stderr


def test_the_core_leaves_out_the_extras_and_the_tests_take_everything(repo: Path, tmp_path: Path) -> None:
    """SUPERTUNE_PACKAGES=core installs the pins of what a training run needs: not those of
    pyproject.toml's extras (pytest, DeepSpeed, W&B, MLflow, lm-evaluation-harness, torchao, Opacus, cryptography)."""
    core = _print(repo, tmp_path, SUPERTUNE_TORCH="cpu", SUPERTUNE_PACKAGES="core")
    assert core.returncode == 0, core.stderr
    [line] = [x for x in core.stdout.splitlines() if "pip install torch==2.13.0 transformers==" in x]
    names = {pin.split("==")[0].lower() for pin in line.split("pip install ", 1)[1].split()}
    assert {"torch", "transformers", "accelerate", "datasets", "peft", "safetensors", "matplotlib"} <= names
    extras = {
        "pytest",
        "pytest-xdist",
        "ruff",
        "deepspeed",
        "wandb",
        "mlflow",
        "lm_eval",
        "torchao",
        "opacus",
        "cryptography",
    }
    assert not names & extras
    everything = _print(repo, tmp_path, SUPERTUNE_TORCH="cpu")
    assert f"pip install -r {repo}/src/supertune/pinned-requirements.txt" in everything.stdout
    wrong = _print(repo, tmp_path, SUPERTUNE_PACKAGES="most")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines()[-1].startswith(
        "supertune: SUPERTUNE_PACKAGES=most is not a choice; use all"
    )


def test_the_default_run_takes_a_core_venv_and_the_full_install_does_not(repo: Path, tmp_path: Path) -> None:
    """A venv stamped for the core serves `bash scripts/train-default.sh` as it is, and so does one
    stamped for everything; `bash scripts/env.sh` (every package) installs into the core one. The
    venv's python is this test's, behind a wrapper that records and refuses any pip call."""
    import hashlib
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    calls = tmp_path / "pip-calls"
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/bin/bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {calls}; exit 1; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    (venv / "bin" / "supertune").symlink_to(Path(sys.executable).parent / "supertune")
    pins = (repo / "src" / "supertune" / "pinned-requirements.txt").read_bytes() + (
        repo / "pyproject.toml"
    ).read_bytes()
    stamp = hashlib.sha256(pins + b"cpu\n").hexdigest()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_") and k != "VIRTUAL_ENV"}
    env.update(SUPERTUNE_VENV=str(venv), SUPERTUNE_TORCH="cpu", SUPERTUNE_STREAMFLOW="0")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", *argv], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    for stamped in (f"{stamp} core", stamp):
        (venv / ".supertune-installed").write_text(stamped + "\n")
        proc = run(str(repo / "scripts" / "train-default.sh"), "--help")
        assert proc.returncode == 0 and proc.stdout.startswith("usage: supertune train"), proc.stderr
        assert not calls.exists(), calls.read_text()
    (venv / ".supertune-installed").write_text(f"{stamp} core\n")
    proc = run(str(repo / "scripts" / "env.sh"))
    assert proc.returncode != 0 and calls.is_file(), proc.stderr
    assert "preparing" in proc.stderr and (venv / ".supertune-installed").read_text() == f"{stamp} core\n"
