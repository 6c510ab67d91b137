"""`supertune container`: the Apptainer definition keeps the base image's torch and installs the tested
pins of everything else; the conda environment carries every pin; sites without a base image are refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from supertune import __version__
from supertune.cli.main import main
from supertune.clusters import load_profile
from supertune.container import read_pins, render_definition, resolve_source, runtime_pins
from supertune.container.conda_env import CONDA_PYTHON
from supertune.container.definition import MIN_PYTHON

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "config"))


def pinned_file() -> dict[str, str]:
    """pinned-requirements.txt read independently of the code under test: name -> version."""
    out = {}
    for line in (REPO / "src" / "supertune" / "pinned-requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name] = version
    return out


def section(text: str, name: str) -> str:
    """The body of one %section of a definition file."""
    match = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no %{name} section"
    return match.group(1)


def pip_installed(text: str) -> dict[str, str]:
    """name -> version of every quoted requirement in the definition's %post."""
    return dict(re.findall(r'"([A-Za-z0-9._-]+)==([^"]+)"', section(text, "post")))


def write(cluster: str, out: Path, *extra: str) -> tuple[str, dict]:
    assert main(["container", "--cluster", cluster, "--out", str(out), *extra]) == 0
    return (out / "supertune.def").read_text(), yaml.safe_load((out / "environment.yml").read_text())


def test_pins_are_read_from_the_package_data():
    assert {p.name: p.version for p in read_pins()} == pinned_file()
    runtime = {p.name for p in runtime_pins()}
    assert "torch" in runtime and "transformers" in runtime and "pytest" not in runtime and "ruff" not in runtime


@pytest.mark.parametrize("cluster, image", [("leonardo", "nvcr.io/nvidia/pytorch:"), ("lumi", "rocm/pytorch:")])
def test_definition_keeps_the_image_torch_and_installs_the_pins(cluster, image, tmp_path, capsys):
    text, _ = write(cluster, tmp_path / "out")
    out = capsys.readouterr().out
    profile = load_profile(cluster)
    assert text.startswith(f"Bootstrap: docker\nFrom: {profile.container.base_image.removeprefix('docker://')}\n")
    assert f"From: {image}" in text
    pins = pinned_file()
    expected = {name: version for name, version in pins.items() if name not in ("torch", "pytest", "ruff")}
    assert pip_installed(text) == expected
    # torch is the base image's: never a pip requirement, and pip is constrained to keep it.
    assert f"torch=={pins['torch']}" not in text
    assert not re.search(r'^\s*"torch[=<>"]', section(text, "post"), re.MULTILINE)
    assert "--constraint /tmp/keep-torch.txt" in text
    assert "--no-deps /opt/supertune-src" in text and f"{REPO}/src /opt/supertune-src/src" in section(text, "files")
    assert f"org.supertune.cluster {cluster}" in section(text, "labels")
    assert f"org.supertune.version {__version__}" in text
    flag = "--nv" if profile.gpu_vendor == "nvidia" else "--rocm"
    assert f"exec {flag} supertune-{cluster}.sif" in section(text, "help")
    # What was written and how to build it.
    runtime = profile.container.runtime
    assert f"wrote {tmp_path / 'out' / 'supertune.def'}" in out
    assert f"{runtime} build supertune-{cluster}.sif {tmp_path / 'out' / 'supertune.def'}" in out
    assert (
        f"cotainr build supertune-{cluster}-conda.sif" in out
        and f"--conda-env={tmp_path / 'out' / 'environment.yml'}" in out
    )


def test_definition_shell_sections_are_valid_and_set_the_profile_environment(tmp_path):
    text, _ = write("lumi", tmp_path)
    for name in ("post", "environment", "test"):
        check = subprocess.run(["sh", "-n"], input=section(text, name), text=True, capture_output=True)
        assert check.returncode == 0, (name, check.stderr)
    script = (
        section(text, "environment")
        + '\nprintf "%s\\n" "$HF_HOME" "$HF_HUB_OFFLINE" "$TOKENIZERS_PARALLELISM" "$PYTHONNOUSERSITE" "${NCCL_SOCKET_IFNAME:-unset}"\n'
    )
    env = {"PATH": os.environ["PATH"], "USER": "alice"}
    lines = subprocess.run(
        ["sh", "-c", script], env=env, text=True, capture_output=True, check=True
    ).stdout.splitlines()
    assert lines == ["/scratch/project_465000000/alice/hf-home", "1", "false", "1", "unset"]
    # A value set before the container starts wins over the image's.
    env["HF_HOME"] = "/flash/mine"
    lines = subprocess.run(
        ["sh", "-c", script], env=env, text=True, capture_output=True, check=True
    ).stdout.splitlines()
    assert lines[0] == "/flash/mine"


def test_environment_yml_has_every_pin(tmp_path):
    pins = pinned_file()
    expected = {f"{name}=={version}" for name, version in pins.items() if name not in ("pytest", "ruff")}
    for cluster in ("leonardo", "lumi"):
        _, env = write(cluster, tmp_path / cluster)
        assert env["name"] == "supertune" and f"python={CONDA_PYTHON}" in env["dependencies"]
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        requirements = {re.sub(r"\+rocm[0-9.]+$", "", r) for r in pip if "==" in r}
        assert requirements == expected, cluster
        assert str(REPO) in pip  # supertune itself, from this checkout
        index = load_profile(cluster).container.torch_index_url
        if cluster == "lumi":
            label = index.rstrip("/").rsplit("/", 1)[-1]
            assert f"--extra-index-url {index}" in pip and f"torch=={pins['torch']}+{label}" in pip
        else:
            assert index is None and not any(r.startswith("--") for r in pip) and f"torch=={pins['torch']}" in pip


def test_supertune_from_a_requirement(tmp_path):
    text, env = write("karolina", tmp_path, "--supertune", f"supertune=={__version__}")
    assert "%files" not in text
    assert f'--no-deps "supertune=={__version__}"' in text
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip[-1] == f"supertune=={__version__}"


def test_local_is_refused_clearly(tmp_path, capsys):
    assert main(["container", "--cluster", "local", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("supertune: error: --cluster: the profile 'local' has no container.base_image")
    assert "\n" not in err
    assert not (tmp_path / "out").exists()


def test_unknown_cluster_and_bad_source_are_refused(tmp_path, capsys):
    assert main(["container", "--cluster", "leonrado", "--out", str(tmp_path)]) == 2
    assert "--cluster: unknown cluster 'leonrado' (did you mean leonardo?)" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert (
        main(["container", "--cluster", "lumi", "--out", str(tmp_path / "o"), "--supertune", str(tmp_path / "empty")])
        == 2
    )
    assert "is not a supertune source checkout (no pyproject.toml, README.md, src)" in capsys.readouterr().err


def test_user_base_image_from_a_local_sif(tmp_path):
    clusters = tmp_path / "config" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "leonardo.yaml").write_text("container: {base_image: /leonardo_work/images/pytorch.sif}\n")
    text = render_definition(load_profile("leonardo"), runtime_pins(), resolve_source(f"supertune=={__version__}"))
    assert text.startswith("Bootstrap: localimage\nFrom: /leonardo_work/images/pytorch.sif\n")


def test_python_versions_agree_with_pyproject():
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert spec == f">={MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    assert tuple(int(x) for x in CONDA_PYTHON.split(".")) >= MIN_PYTHON


def test_container_module_imports_no_torch():
    probe = (
        "import sys, json\n"
        "from supertune.clusters import load_profile\n"
        "from supertune.container import render_definition, render_environment, runtime_pins, resolve_source\n"
        "p = load_profile('lumi'); s = resolve_source(None)\n"
        "render_definition(p, runtime_pins(), s); render_environment(p, runtime_pins(), s)\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_cotainr_builds_on_the_site_system_where_its_cotainr_has_one(tmp_path, capsys):
    """LUMI's cotainr picks LUMI's ROCm base image with --system=lumi-g; elsewhere a plain Ubuntu base."""
    write("lumi", tmp_path / "lumi")
    out = capsys.readouterr().out
    assert (
        f"cotainr build supertune-lumi-conda.sif --system=lumi-g --conda-env={tmp_path / 'lumi' / 'environment.yml'}"
        in out
    )
    assert "--base-image" not in out.split("cotainr build", 1)[1]
    assert (
        "#   cotainr build supertune-lumi-conda.sif --system=lumi-g --conda-env=environment.yml"
        in (tmp_path / "lumi" / "environment.yml").read_text()
    )
    write("leonardo", tmp_path / "leonardo")
    assert (
        "cotainr build supertune-leonardo-conda.sif --base-image=docker://ubuntu:24.04 --conda-env="
        in capsys.readouterr().out
    )
