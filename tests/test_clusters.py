"""Cluster profiles: every shipped one loads, key facts are pinned, user files merge over them, and
every bad profile fails with one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from supertune.cli.main import main
from supertune.clusters import (
    ClusterProfile,
    ProfileError,
    list_profiles,
    load_profile,
    profile_sources,
    shipped_profile_dir,
    user_profile_dir,
)
from supertune.errors import UserError

REPO = Path(__file__).resolve().parent.parent
PROFILES_IN_SOURCE = REPO / "src" / "supertune" / "clusters" / "profiles"


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch) -> Path:
    """An empty user profile directory, so that the tester's own profiles never leak in."""
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "config"))
    directory = tmp_path / "config" / "clusters"
    directory.mkdir(parents=True)
    return directory


def write_user(user_dir: Path, name: str, text: str) -> Path:
    path = user_dir / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_every_shipped_profile_loads_and_none_is_hidden():
    files = sorted(PROFILES_IN_SOURCE.rglob("*.yaml")) + sorted(PROFILES_IN_SOURCE.rglob("*.yml"))
    assert shipped_profile_dir().resolve() == PROFILES_IN_SOURCE.resolve()
    profiles = list_profiles()
    assert len(files) >= 9
    assert len(profiles) == len(files)
    assert sorted(p.name for p in profiles) == sorted(f.stem for f in files)
    assert {"lumi", "leonardo", "karolina", "ibex", "meluxina", "iris", "twcc", "setonix", "local"} <= {
        p.name for p in profiles
    }
    for p in profiles:
        assert isinstance(p, ClusterProfile) and p.description


def test_gpu_profiles_follow_the_conventions():
    for p in list_profiles():
        if p.gpus_per_node == 0:
            continue
        assert p.env["OMP_NUM_THREADS"] == str(p.cpus_per_gpu), p.name
        assert p.env["HF_HUB_OFFLINE"] == "1" and p.env["HF_DATASETS_OFFLINE"] == "1", p.name
        assert p.env["TOKENIZERS_PARALLELISM"] == "false", p.name
        assert p.env["HF_HOME"] and p.env["TORCH_HOME"], p.name
        assert p.cpus_per_gpu * p.gpus_per_node <= p.cpus_per_node, p.name
        assert p.container.runtime in ("apptainer", "singularity"), p.name
        image = {"nvidia": "docker://nvcr.io/nvidia/pytorch:", "amd": "docker://rocm/pytorch:"}[p.gpu_vendor]
        assert p.container.base_image.startswith(image), p.name
        assert p.peak_bf16_tflops_per_gpu > 0 and p.gpu_memory_gb > 0, p.name
        assert not any("TOKEN" in name and name != "TOKENIZERS_PARALLELISM" for name in p.env), p.name
        # Uncertain values are marked in the file, not left to be taken as fact.
        assert "CHECK" in (PROFILES_IN_SOURCE / f"{p.name}.yaml").read_text(encoding="utf-8"), p.name


def test_pinned_facts():
    lumi = load_profile("lumi")
    assert (lumi.gpu_vendor, lumi.gpus_per_node, lumi.gpu_memory_gb) == ("amd", 8, 64)
    assert lumi.peak_bf16_tflops_per_gpu == 191.5
    assert (lumi.cpus_per_gpu, lumi.cpus_per_node) == (7, 56)
    assert lumi.partition == "standard-g" and lumi.account.startswith("project_465")
    assert lumi.env["NCCL_SOCKET_IFNAME"] == "hsn" and lumi.env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert lumi.env["MIOPEN_USER_DB_PATH"].startswith("/tmp/")
    assert lumi.env["MIOPEN_CUSTOM_CACHE_DIR"].startswith("/tmp/")
    assert lumi.container.runtime == "singularity"
    assert {"/project", "/scratch", "/flash"} <= set(lumi.container.binds)

    twcc = load_profile("twcc")
    assert (twcc.gpus_per_node, twcc.cpus_per_gpu, twcc.gpu_vendor) == (8, 4, "nvidia")

    leonardo = load_profile("leonardo")
    assert (leonardo.gpus_per_node, leonardo.gpu_model, leonardo.gpu_memory_gb) == (4, "A100 64GB", 64)
    assert leonardo.peak_bf16_tflops_per_gpu == 312 and leonardo.cpus_per_node == 32

    karolina = load_profile("karolina")
    assert (karolina.gpus_per_node, karolina.gpu_memory_gb, karolina.cpus_per_node) == (8, 40, 128)
    meluxina = load_profile("meluxina")
    assert (meluxina.gpus_per_node, meluxina.gpu_memory_gb, meluxina.peak_bf16_tflops_per_gpu) == (4, 40, 312)
    setonix = load_profile("setonix")
    assert (setonix.gpu_vendor, setonix.gpus_per_node, setonix.peak_bf16_tflops_per_gpu) == ("amd", 8, 191.5)
    assert load_profile("iris").gpus_per_node == 4

    # V100 has no bf16: its fp16 tensor peak stands in, and the profile switches training to fp16.
    for name in ("ibex", "iris", "twcc"):
        v100 = load_profile(name)
        assert v100.gpu_model.startswith("V100") and v100.peak_bf16_tflops_per_gpu == 125
        assert v100.run_config["training"] == {"bf16": False, "fp16": True}

    local = load_profile("local")
    assert (local.gpu_vendor, local.gpus_per_node, local.modules) == ("none", 0, [])
    assert local.container.runtime == "none" and local.container.base_image is None


def test_user_file_deep_merges_over_the_shipped_one(user_dir):
    write_user(
        user_dir,
        "lumi.yaml",
        """
        account: project_465001234
        env:
          HF_HOME: /flash/project_465001234/${USER}/hf
          CXI_FORK_SAFE: null        # removes the shipped variable
        container:
          image: /project/project_465001234/supertune.sif
        """,
    )
    lumi = load_profile("lumi")
    assert lumi.account == "project_465001234"
    assert lumi.env["HF_HOME"] == "/flash/project_465001234/${USER}/hf"
    assert "CXI_FORK_SAFE" not in lumi.env
    # Everything not named in the user file is the shipped value.
    assert (lumi.gpus_per_node, lumi.gpu_vendor, lumi.partition) == (8, "amd", "standard-g")
    assert lumi.env["NCCL_SOCKET_IFNAME"] == "hsn" and lumi.env["OMP_NUM_THREADS"] == "7"
    assert lumi.container.runtime == "singularity" and "/flash" in lumi.container.binds
    assert lumi.container.image == "/project/project_465001234/supertune.sif"
    sources = profile_sources()["lumi"]
    assert sources.user == user_dir / "lumi.yaml" and sources.shipped == shipped_profile_dir() / "lumi.yaml"


def test_user_file_adds_a_profile(user_dir):
    write_user(
        user_dir,
        "mysite.yml",
        """
        description: "my site: 4 H100 per node"
        gpu_vendor: nvidia
        gpu_model: H100 80GB
        gpus_per_node: 4
        gpu_memory_gb: 80
        peak_bf16_tflops_per_gpu: 989
        cpus_per_gpu: 16
        cpus_per_node: 64
        env: {OMP_NUM_THREADS: 16}
        """,
    )
    names = [p.name for p in list_profiles()]
    assert "mysite" in names and "lumi" in names
    mysite = load_profile("mysite")
    assert (mysite.gpus_per_node, mysite.peak_bf16_tflops_per_gpu) == (4, 989)
    assert mysite.env == {"OMP_NUM_THREADS": "16"}  # a YAML number becomes environment text


def test_bad_user_key_is_one_line_naming_file_and_key(user_dir, capsys):
    path = write_user(user_dir, "lumi.yaml", "gpus_per_nodes: 4\n")
    with pytest.raises(ProfileError) as info:
        load_profile("lumi")
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert "gpus_per_nodes: unknown key (did you mean gpus_per_node?)" in message
    # The same through the CLI: exit 2, one line on stderr.
    assert main(["clusters", "show", "lumi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "gpus_per_nodes" in err and str(path) in err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpus_per_node: eight\n", "gpus_per_node: expected an integer, got 'eight'"),
        ("gpu_vendor: nvida\n", "gpu_vendor: 'nvida' is not one of nvidia, amd, none (did you mean nvidia?)"),
        ("container: {runtim: apptainer}\n", "container.runtim: unknown key (did you mean container.runtime?)"),
        ("env: {HF_TOKEN: hf_abc}\n", "env.HF_TOKEN: secrets do not belong in a cluster profile"),
        ("env: {HF_HOME: /scratch/$(whoami)/hf}\n", "env.HF_HOME: '/scratch/$(whoami)/hf' runs a command"),
        ("env: {HF_HOME: '${SCRATCH:-/tmp}/hf'}\n", "env.HF_HOME: '${SCRATCH:-/tmp}/hf' has a $ that is not"),
        ("cpus_per_gpu: 9\n", "cpus_per_gpu: 9 cores for each of 8 GPUs is more than the node's 56"),
        ("gpu_vendor: none\n", "gpu_vendor: is none but gpus_per_node is 8"),
        ("container: {binds: [scratch]}\n", "container.binds[0]: 'scratch' is not host[:container[:ro|rw]]"),
        (
            "run_config: {training: {bf17: true}}\n",
            "run_config.training.bf17: unknown key (did you mean training.bf16?)",
        ),
        ("name: leonardo\n", "name: 'leonardo' differs from the file name"),
        ("gpus_per_node: [8\n", "is not valid YAML at line 2"),
        ("module_use: [appl/modules]\n", "module_use[0]: 'appl/modules' is not an absolute directory path"),
        ("module_use: ['/appl/my modules']\n", "module_use[0]: '/appl/my modules' is not an absolute directory path"),
        ("container: {cotainr_system: 'lumi g'}\n", "container.cotainr_system: 'lumi g' is not a cotainr system name"),
    ],
)
def test_bad_user_profile_names_file_and_key(user_dir, text, expected):
    path = write_user(user_dir, "lumi.yaml", text)
    with pytest.raises(ProfileError) as info:
        load_profile("lumi")
    message = str(info.value)
    assert str(path) in message
    assert expected in message, message
    assert "\n" not in message


def test_every_problem_of_every_file_is_reported_at_once(user_dir):
    write_user(user_dir, "lumi.yaml", "gpus_per_nodes: 4\n")
    write_user(user_dir, "mysite.yaml", "cpus_per_gpu: lots\n")
    with pytest.raises(ProfileError) as info:
        list_profiles()
    assert len(info.value.problems) == 2
    assert str(info.value).startswith("2 problems in cluster profiles:")


def test_unknown_name_suggests_the_close_one():
    with pytest.raises(UserError) as info:
        load_profile("lumii")
    message = str(info.value)
    assert message.startswith("launch.cluster: unknown cluster 'lumii' (did you mean lumi?); known: ")
    assert "leonardo" in message and "twcc" in message
    with pytest.raises(UserError, match=r"^--cluster: unknown cluster 'karolna' \(did you mean karolina\?\)"):
        load_profile("karolna", what="--cluster")


def test_user_profile_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "b"))
    assert user_profile_dir() == tmp_path / "a" / "clusters"
    monkeypatch.delenv("SUPERTUNE_CONFIG_DIR")
    assert user_profile_dir() == tmp_path / "b" / "supertune" / "clusters"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_profile_dir() == tmp_path / "home" / ".config" / "supertune" / "clusters"


def test_clusters_list_and_show_through_the_cli(user_dir, capsys):
    write_user(user_dir, "twcc.yaml", "account: MST110123\n")
    assert main(["clusters", "list"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:4] == ["NAME", "GPUS/NODE", "GPU", "MODEL"]
    for line in out.splitlines()[1:10]:
        assert line.split()[0] in {p.name for p in list_profiles()}
    lumi_row = next(line for line in out.splitlines() if line.startswith("lumi "))
    assert lumi_row.split()[1:5] == ["8", "MI250X", "GCD", "amd"]
    assert "twcc (user)" in out and str(user_dir) in out

    assert main(["clusters", "show", "twcc"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("# cluster profile twcc: shipped ") and str(user_dir / "twcc.yaml") in first
    data = yaml.safe_load(out)
    assert data["account"] == "MST110123" and data["gpus_per_node"] == 8 and data["cpus_per_gpu"] == 4
    assert data["container"]["base_image"].startswith("docker://nvcr.io/nvidia/pytorch:")

    assert main(["clusters", "show", "lumii"]) == 2
    assert "did you mean lumi?" in capsys.readouterr().err
    assert main(["clusters", "show"]) == 2
    assert "give a profile name" in capsys.readouterr().err


def test_loading_profiles_imports_no_torch():
    probe = (
        "import json, sys\n"
        "from supertune.cli.main import main\n"
        "main(['clusters', 'list'])\n"
        "from supertune.clusters import list_profiles\n"
        "list_profiles()\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_module_search_paths_come_before_the_modules_in_every_job_script():
    """LUMI's AI guide: `module use` of its training modules, then `module load` of modules found there.
    The training job script and the prepare jobs render the same section."""
    from supertune.slurm.prepare_script import PrepareJob, render_array_script
    from supertune.slurm.script import modules_section

    lumi = load_profile("lumi")
    assert lumi.module_use == ["/appl/local/training/modules/AI-20240529"] and lumi.modules == ["singularity-CPEbits"]
    lines = modules_section(lumi).splitlines()
    assert lines[-3:] == [
        "module use /appl/local/training/modules/AI-20240529",
        "module load singularity-CPEbits",
        "set -u",
    ]
    purged = dataclasses.replace(lumi, module_purge=True, module_use=["/a/x", "/b/y"], modules=[])
    assert modules_section(purged).splitlines()[-3:] == ["module purge", "module use /a/x /b/y", "set -u"]
    job = PrepareJob("p", "/w", "/o", 2, 4, "01:00:00", None, None, None, None, (), "python3")
    assert (
        "\nmodule use /appl/local/training/modules/AI-20240529\nmodule load singularity-CPEbits\n"
        in render_array_script(job, lumi, [0, 1])
    )
    assert modules_section(load_profile("local")) == ""
