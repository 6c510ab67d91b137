"""Jobs that would fail only after their wait in the queue are refused before sbatch: a CPU build of
PyTorch for a GPU profile (read from the installed distribution, torch not imported), a profile's
placeholder values, more cores than a node has; a dry run shows them as warnings. And LUMI's MIOpen
directories are made on every node by the job script."""

from __future__ import annotations

import pytest

from supertune.cli.main import main
from supertune.runs.submit_checks import installed_torch_build


def _refusal(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.strip()]


def test_the_build_is_read_from_the_distribution_as_torch_itself_reports_it() -> None:
    import torch

    version, build = installed_torch_build()
    assert version == torch.__version__
    want = "cuda" if torch.version.cuda else "rocm" if torch.version.hip else "cpu"
    assert build == want


def test_a_cpu_build_and_placeholders_are_refused_before_anything_exists(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "config"))
    run_dir = tmp_path / "run"
    if installed_torch_build()[1] != "cpu":
        pytest.skip("needs a CPU build of torch, as the test machines have")
    assert main(["submit", "--cluster", "lumi", "--run-dir", str(run_dir)]) == 2
    lines = _refusal(capsys)
    assert lines[0] == "supertune: error: 6 problems would stop the job after its wait in the queue:"
    assert "its torch 2.13.0+cpu is a CPU build, which cannot use the nodes' AMD GPUs" in lines[1]
    assert "--index-url https://download.pytorch.org/whl/rocm6.4" in lines[1]
    user_file = tmp_path / "config" / "clusters" / "lumi.yaml"
    assert lines[2] == (
        "  - launch.cluster lumi: account is 'project_465000000', which holds the shipped placeholder 'project_465000000'; "
        f"write your own value of account in {user_file}, which overrides the shipped profile (or give slurm.account)"
    )
    assert [line.split(": ")[1] for line in lines[3:5]] == [
        "env.HF_HOME is '/scratch/project_465000000/${USER}/hf-home', which holds the shipped placeholder 'project_465000000'; write your own value of env.HF_HOME in "
        + str(user_file)
        + ", which overrides the shipped profile",
        "env.TORCH_HOME is '/scratch/project_465000000/${USER}/torch-home', which holds the shipped placeholder 'project_465000000'; write your own value of env.TORCH_HOME in "
        + str(user_file)
        + ", which overrides the shipped profile",
    ]
    # module names shipped as unchecked examples (CHECK) are placeholders too
    assert lines[5:] == [
        f"  - launch.cluster lumi: {key} {value!r} are the shipped profile's examples, not checked on lumi (marked "
        f"CHECK); write the site's own {key} (see `module avail` there) in {user_file}, which overrides the shipped "
        "profile (the same value written there confirms it)"
        for key, value in (
            ("module_use", ["/appl/local/training/modules/AI-20240529"]),
            ("modules", ["singularity-CPEbits"]),
        )
    ]
    assert not run_dir.exists()

    # the user's own values (the shipped modules confirmed by writing them), and slurm.account for
    # the account: only the torch build is left
    user_file.parent.mkdir(parents=True)
    user_file.write_text(
        "env:\n  HF_HOME: /scratch/project_465001234/hf\n  TORCH_HOME: /scratch/project_465001234/t\n"
        "module_use: [/appl/local/training/modules/AI-20250204]\nmodules: [singularity-CPEbits]\n"
    )
    assert main(["submit", "--cluster", "lumi", "--run-dir", str(run_dir), "slurm.account=project_465001234"]) == 2
    lines = _refusal(capsys)
    assert len(lines) == 1 and "CPU build" in lines[0] and not run_dir.exists()

    # a dry run warns and writes the script
    assert main(["submit", "--dry-run", "--cluster", "lumi", "--run-dir", str(run_dir)]) == 0
    warned = [line for line in _refusal(capsys) if "a real submission would be refused" in line]
    assert len(warned) == 2 and (run_dir / "job.sbatch").is_file()
    assert "module use /appl/local/training/modules/AI-20250204" in (run_dir / "job.sbatch").read_text()


def test_a_container_image_brings_its_own_torch(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "config"))
    (tmp_path / "config" / "clusters").mkdir(parents=True)
    (tmp_path / "config" / "clusters" / "karolina.yaml").write_text(
        "account: DD-24-3\ncontainer:\n  runtime: apptainer\n  image: /scratch/me/supertune.sif\n"
        "env:\n  HF_HOME: /scratch/project/dd-24-3/hf\n  TORCH_HOME: /scratch/project/dd-24-3/t\n"
        "modules: [CUDA/12.2.0]\n"
    )
    assert main(["submit", "--dry-run", "--cluster", "karolina", "--run-dir", str(tmp_path / "run")]) == 0
    assert "a real submission would be refused" not in capsys.readouterr().err


def test_more_cores_than_a_node_has_is_refused_in_a_dry_run_too(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["submit", "--dry-run", "--cluster", "ibex", "launch.gpus_per_node=8", "--run-dir", str(run_dir)]) == 2
    assert _refusal(capsys) == [
        "supertune: error: launch.gpus_per_node: 8 GPUs with 6 cores each (cpus_per_gpu) need 48 cores, more than the 32 "
        "of a node of cluster ibex (cpus_per_node), so Slurm would never start the job; use fewer GPUs per node, or set "
        "cpus_per_gpu and cpus_per_node to the nodes' own in your profile"
    ]
    assert not run_dir.exists()


def test_node_dirs_are_checked_like_container_paths(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "config"))
    (tmp_path / "config" / "clusters").mkdir(parents=True)
    user = tmp_path / "config" / "clusters" / "lumi.yaml"
    user.write_text('node_dirs: ["tmp/miopen", "/tmp/$user"]\nplaceholder_keys: [moduls]\n')
    assert main(["clusters", "show", "lumi"]) == 2
    err = capsys.readouterr().err
    assert "node_dirs[0]: 'tmp/miopen' is not an absolute path" in err
    assert "node_dirs[1]: '/tmp/$user' refers to $user, which no job's environment sets" in err
    assert "placeholder_keys[0]: 'moduls' is not a key of a profile; name one, e.g. modules" in err
