"""`supertune eval MODEL --tasks ... --submit`: the benchmarks as a SLURM job on the model's run's
cluster. The job script is pinned by golden files (pure rendering, every value quoted) and checked
by bash -n and shellcheck; the CLI's choices (the run's cluster, --cluster, --time) are read from
its dry run; one real job on the Slurm test cluster writes its scores beside the model.

SUPERTUNE_UPDATE_GOLDEN=1 rewrites the golden files from the current renderer (then review the diff).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supertune.benchmarks.job import BenchmarkJob, benchmark_job
from supertune.clusters import load_profile
from supertune.config import dump_config
from supertune.resolve import resolve_run_config
from supertune.slurm.script import render_sbatch

GOLDEN = Path(__file__).resolve().parent / "golden" / "benchmarks"
UPDATE = os.environ.get("SUPERTUNE_UPDATE_GOLDEN", "") not in ("", "0")
PYTHON = "/opt/supertune/venv/bin/python"
# A run directory whose name a shell would split and unquote: the script must hold it as one word.
MODEL = "/scratch/runs/it's a run; rm -rf ~/model"
BENCH = BenchmarkJob(MODEL, ("supertune_corpus", "hellaswag"), 200, 8, "auto")


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "no-user-config"))


def _render(cluster: str) -> str:
    overrides = [f"launch.cluster={cluster}", "launch.nodes=4", "output.name=golden", "slurm.time=02:00:00"]
    cfg = resolve_run_config(None, overrides, trains=False)
    profile = load_profile(cluster)
    directory = Path(MODEL).parent / "benchmarks-job"
    return render_sbatch(benchmark_job(cfg, profile, directory, BENCH, PYTHON), profile, "MODEL")


@pytest.mark.parametrize("cluster", ["local", "leonardo"])
def test_the_job_script_matches_its_golden_file_and_passes_shellcheck(cluster: str, tmp_path: Path) -> None:
    text = _render(cluster)
    path = GOLDEN / f"{cluster}.sbatch"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"rendering changed; SUPERTUNE_UPDATE_GOLDEN=1 rewrites {path.name}"
    )
    # One process on one node (of the run's 4), at most one GPU, the model's path one quoted word.
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    assert ("#SBATCH --gpus-per-node=1\n" in text) == (cluster == "leonardo")
    assert (
        "-m supertune.entry bench-eval '/scratch/runs/it'\"'\"'s a run; rm -rf ~/model' --tasks supertune_corpus,hellaswag "
        "--batch-size 8 --verify auto --limit 200 &"
    ) in text
    script = tmp_path / "job.sbatch"
    script.write_text(text, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        lint = subprocess.run(
            [shellcheck, "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True
        )
        assert lint.returncode == 0, lint.stdout


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUPERTUNE_CONFIG_DIR": str(cwd / "no-user-config")}
    return subprocess.run(
        [sys.executable, "-m", "supertune", "eval", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_the_dry_run_takes_the_runs_cluster_and_refuses_what_it_cannot_place(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    cfg = resolve_run_config(None, ["launch.cluster=lumi", "slurm.account=project_465000001"], trains=False)
    (run / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    proc = _cli(str(run / "model"), "--tasks", "supertune_corpus", "--submit", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --account=project_465000001\n" in proc.stdout and "#SBATCH --partition=standard-g\n" in proc.stdout
    assert f"#SBATCH --output={run}/benchmarks-job/logs/%x-%j.out\n" in proc.stdout
    assert not (run / "benchmarks-job").exists()  # a dry run writes nothing
    proc = _cli(str(run / "model"), "--tasks", "supertune_corpus", "--submit", "--dry-run", "--cluster", "leonardo",
                "--time", "00:30:00", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --time=00:30:00\n" in proc.stdout and "#SBATCH --partition=boost_usr_prod\n" in proc.stdout
    bare = tmp_path / "bare-model"
    bare.mkdir()
    for args, error in (
        ((str(bare), "--tasks", "supertune_corpus", "--submit"), f"--cluster: {bare} is not a run's model"),
        (
            (str(bare), "--tasks", "supertune_corpus", "--cluster", "local"),
            "--cluster: only applies with --tasks --submit",
        ),
        ((str(bare), "--submit"), "--submit: only applies with --tasks (benchmarks)"),
        ((str(tmp_path / "none"), "--tasks", "x", "--submit", "--cluster", "local"), "MODEL: "),
        ((str(bare), "--tasks", "x", "--submit", "--cluster", "local", "--time", "soon"), "slurm.time: "),
    ):
        proc = _cli(*args, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines[-1].startswith(f"supertune: error: {error}"), proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


def _tiny_model(path: Path) -> Path:
    """An untrained one-layer model of the embedded default, with the embedded tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from supertune.embedded.model import default_model_config
    from supertune.embedded.tokenizer import default_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer())
    config = default_model_config(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    AutoModelForCausalLM.from_config(LlamaConfig(**{**config, "num_hidden_layers": 1})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_benchmark_job_on_slurm_records_its_scores_beside_the_model(slurm_single, tmp_path: Path) -> None:
    model = _tiny_model(tmp_path / "a model")
    env = {**slurm_single.env, "SUPERTUNE_CONFIG_DIR": str(tmp_path / "no-user-config")}
    argv = [
        sys.executable, "-m", "supertune", "eval", str(model), "--tasks", "supertune_corpus_nouns", "--limit", "8",
        "--submit", "--cluster", "local", "--time", "00:10:00",
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip())
    assert slurm_single.wait(job_id, timeout=240) == "COMPLETED"
    (record,) = [json.loads(line) for line in (model / "benchmarks.jsonl").read_text().splitlines()]
    assert record["model"] == str(model) and set(record["scores"]) == {"supertune_corpus_nouns"}
    assert 0.0 <= record["scores"]["supertune_corpus_nouns"]["acc"] <= 1.0
    log = (model / "benchmarks-job" / "logs" / f"supertune-benchmarks-{job_id}.out").read_text()
    assert f"scores recorded in {model / 'benchmarks.md'}" in log
    (submitted,) = [json.loads(line) for line in (model / "benchmarks-job" / "jobs.jsonl").read_text().splitlines()]
    assert submitted["job_id"] == str(job_id) and submitted["cluster"] == "local"
