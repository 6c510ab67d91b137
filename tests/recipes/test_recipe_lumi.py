"""Replay of docs/tutorials/lumi-accelerate-container.md: LUMI's AI-guide recipe (a cotainr image on
LUMI's ROCm base, module use of LUMI's training modules, container binds and RCCL/MIOpen settings in
the job, one `accelerate launch` per node), CPU-scaled.

1. `supertune container --cluster lumi`: the cotainr command on LUMI's base (--system=lumi-g).
2. `supertune submit ... --dry-run` with the shipped LUMI profile and the user's image: the job script
   has the module search path before the modules, the binds, the environment, 32 processes.
3. The same run config through the accelerate launcher on the Slurm test cluster (the LUMI profile
   adapted to the test node): two processes train with bf16 mixed precision as on LUMI.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from replay import TINY, client_env, run_supertune, site_on_test_cluster, submit_and_wait, summary, write_yaml

from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/lumi-accelerate-container.md"


def _run_yaml(path: Path, train: Path) -> Path:
    """The tutorial's run.yaml scaled to a CPU: the embedded tiny Llama instead of Llama 3 8B."""
    return write_yaml(path, {
        "model": {"config_overrides": {"num_hidden_layers": 1}},
        "data": {"train_files": str(train), "template": "Write a document: {text}", "block_size": 64, "max_eval_samples": 16},
        "training": {"max_steps": 4, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 2.0e-3,
                     "bf16": True, "save_steps": 2},
        "output": {"name": "llama3-it"},
    })  # fmt: skip


def test_container_builds_on_lumis_rocm_base(tmp_path: Path, repo: Path) -> None:
    out = run_supertune(
        "container",
        "--cluster",
        "lumi",
        "--out",
        str(tmp_path / "container"),
        env=client_env({}, tmp_path),
        cwd=tmp_path,
    ).stdout
    assert (
        f"cotainr build supertune-lumi-conda.sif --system=lumi-g --conda-env={tmp_path / 'container' / 'environment.yml'}"
        in out
    )
    environment = yaml.safe_load((tmp_path / "container" / "environment.yml").read_text())
    pip = environment["dependencies"][-1]["pip"]
    assert pip[0].startswith("--extra-index-url https://download.pytorch.org/whl/rocm") and any(
        p.startswith("torch==") and "+rocm" in p for p in pip
    )
    assert "cotainr build" in (repo / TUTORIAL).read_text() and "--system=lumi-g" in (repo / TUTORIAL).read_text()


def test_the_job_script_has_lumis_modules_binds_and_environment(tmp_path: Path, jsonl_files: tuple[Path, Path]) -> None:
    config_dir = tmp_path / "config"
    (config_dir / "clusters").mkdir(parents=True)
    (config_dir / "clusters" / "lumi.yaml").write_text(
        "account: project_465001234\ncontainer:\n  image: /project/project_465001234/supertune-lumi.sif\n",
        encoding="utf-8",
    )
    run_yaml = _run_yaml(tmp_path / "run.yaml", jsonl_files[0])
    run_dir = tmp_path / "dry"
    proc = run_supertune("submit", str(run_yaml), "--cluster", "lumi", "--nodes", "4", "--launcher", "accelerate", "--time", "12:00:00",
                         "--dry-run", "--run-dir", str(run_dir), env=client_env({}, config_dir), cwd=tmp_path)  # fmt: skip
    script = proc.stdout
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8", "#SBATCH --cpus-per-task=56",
                 "#SBATCH --account=project_465001234", "#SBATCH --partition=standard-g"):  # fmt: skip
        assert line + "\n" in script, line
    lines = script.splitlines()
    use = lines.index("module use /appl/local/training/modules/AI-20240529")
    assert lines[use + 1] == "module load singularity-CPEbits"
    for export in ('export NCCL_SOCKET_IFNAME="hsn"', 'export NCCL_NET_GDR_LEVEL="PHB"', 'export MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-${SLURM_JOB_ID}"',
                   'export HF_HUB_OFFLINE="1"', 'export OMP_NUM_THREADS="7"'):  # fmt: skip
        assert export in lines, export
    assert lines.index(export) > use
    # the training step (before it, one srun per node makes the MIOpen directories: node_dirs)
    step = next(line for line in lines if line.startswith("srun ") and " mkdir -p -- " not in line)
    assert ('bash -c \'exec singularity exec --rocm --bind "/project,/scratch,/flash" "/project/project_465001234/supertune-lumi.sif" '
            "python3 -m accelerate.commands.launch --config_file ") in step  # fmt: skip
    assert '--machine_rank "${SLURM_NODEID}"' in step and "--num_processes 32" in step
    accelerate = yaml.safe_load((run_dir / "accelerate_config.yaml").read_text())
    assert (accelerate["num_machines"], accelerate["num_processes"], accelerate["mixed_precision"]) == (4, 32, "bf16")


def test_the_recipe_trains_through_accelerate_on_the_test_cluster(
    slurm_single: SlurmCluster, tmp_path: Path, jsonl_files: tuple[Path, Path]
) -> None:
    config_dir = tmp_path / "config"
    site_on_test_cluster(config_dir, "lumi")
    run_yaml = _run_yaml(tmp_path / "run.yaml", jsonl_files[0])
    run_dir = tmp_path / "run"
    log = submit_and_wait(
        slurm_single, [str(run_yaml), "--cluster", "lumi", "--nodes", "1", "--launcher", "accelerate", "launch.procs_per_node=2", *TINY],
        client_env(slurm_single.env, config_dir), tmp_path, run_dir,
    )  # fmt: skip
    assert " -m accelerate.commands.launch --config_file " in (run_dir / "job.sbatch").read_text()
    assert sorted(re.findall(r"supertune: rank (\d) of 2 on ", log)) == ["0", "1"]
    result = summary(run_dir)
    assert (result["world_size"], result["train_steps"], result["mixed_precision"]) == (2, 4, "bf16")
    assert result["eval_loss"] < 8.0 and (run_dir / "model" / "model.safetensors").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (
        'export NCCL_SOCKET_IFNAME="hsn"' in (run_dir / "job.sbatch").read_text()
    )  # the site's environment, as shipped
