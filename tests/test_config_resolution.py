"""One resolution of a run's config: the cluster profile applied once (below the user's YAML and
command line), site limits enforced, every layer named by --origin and recorded in the run
directory, SLURM values and model.config_overrides checked before anything is created."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supertune.cli.main import main


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tester's own profiles must not change what is resolved; tests may add their own here."""
    config_dir = tmp_path / "user-config"
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(config_dir))
    return config_dir / "clusters"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_override_of_a_profile_setting_survives_the_resolved_file(tmp_path, capsys):
    code, out, err = _cli(capsys, "config", "show", "launch.cluster=ibex", "training.fp16=false")
    assert code == 0, err
    assert yaml.safe_load(out)["training"]["fp16"] is False
    resolved = tmp_path / "r.yaml"
    resolved.write_text(out)
    # Read again (as a run directory's config.yaml is by every worker): the profile does not come back.
    code, again, err = _cli(capsys, "config", "show", str(resolved))
    assert code == 0, err
    assert again == out


def test_the_profile_is_a_site_default_below_the_users_file(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("launch:\n  cluster: ibex\ntraining:\n  fp16: false\n")
    code, out, _ = _cli(capsys, "config", "show", str(run))
    assert code == 0 and yaml.safe_load(out)["training"]["fp16"] is False
    code, out, _ = _cli(capsys, "config", "show", "launch.cluster=ibex")
    assert code == 0
    cfg = yaml.safe_load(out)
    assert cfg["training"]["fp16"] is True and cfg["slurm"]["extra_args"] == ["--constraint=v100"]


def test_a_site_limit_is_refused_not_overridden(capsys):
    code, out, err = _cli(capsys, "config", "show", "launch.cluster=ibex", "training.fp16=false", "training.bf16=true")
    assert code == 2 and out == ""
    assert "training.bf16: the V100 32GB of cluster ibex have no bf16; use training.fp16=true" in err
    assert len(err.strip().splitlines()) == 1


def test_origin_names_the_layer_of_every_value_that_is_not_the_default(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("training:\n  learning_rate: 0.001\n  max_steps: 120\n")
    code, out, err = _cli(capsys, "config", "show", str(run), "launch.cluster=ibex", "training.fp16=false", "--origin")
    assert code == 0, err
    lines = out.splitlines()
    assert f"training.learning_rate: 0.001  # {run}" in lines
    assert f"training.max_steps: 120  # {run}" in lines  # set by the file, even though it is the default value
    assert "training.fp16: false  # command line" in lines
    assert "training.bf16: false  # profile ibex" in lines
    assert "slurm.extra_args: [--constraint=v100]  # profile ibex" in lines
    assert "launch.cluster: ibex  # command line" in lines
    assert not any(line.startswith("training.seed:") for line in lines)  # untouched defaults are left out
    assert len(lines) == 6, out


def test_a_user_profile_over_the_shipped_one_is_one_layer_with_both_files(no_user_profiles, capsys):
    no_user_profiles.mkdir(parents=True)
    (no_user_profiles / "ibex.yaml").write_text("run_config:\n  training:\n    learning_rate: 0.0005\n")
    code, out, err = _cli(capsys, "config", "show", "launch.cluster=ibex", "--origin")
    assert code == 0, err
    assert "training.learning_rate: 0.0005  # profile ibex" in out.splitlines()
    assert "training.fp16: true  # profile ibex" in out.splitlines()  # the shipped file's, merged under the user's


def test_the_run_directory_records_the_resolution(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, _, err = _cli(
        capsys, "submit", "--cluster", "ibex", "--run-dir", str(run_dir), "--dry-run", "training.fp16=false"
    )
    assert code == 0, err
    record = json.loads((run_dir / "resolution.json").read_text())
    assert record["layers"] == ["default", "profile ibex", "command line"]
    [shipped] = record["profile"]["files"]
    assert record["profile"]["name"] == "ibex" and shipped["path"].endswith("clusters/profiles/ibex.yaml")
    assert shipped["sha256"] == hashlib.sha256(Path(shipped["path"]).read_bytes()).hexdigest()
    assert record["origins"]["training.fp16"] == "command line" and record["origins"]["training.bf16"] == "profile ibex"
    assert "training.fp16=false" in record["overrides"] and "launch.cluster=ibex" in record["overrides"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["fp16"] is False


def test_the_same_submit_command_twice_is_the_same_run(tmp_path, capsys):
    argv = ["submit", "--cluster", "ibex", "--run-dir", str(tmp_path / "run"), "--dry-run", "training.fp16=false"]
    code, first, err = _cli(capsys, *argv)
    assert code == 0, err
    code, second, err = _cli(capsys, *argv)
    assert code == 0, err  # was refused as "a run with other settings (training.fp16: True -> False)"
    assert "resuming the run in" in err and second == first


def test_every_bad_slurm_value_is_reported_at_once(capsys):
    code, out, err = _cli(
        capsys,
        "config",
        "show",
        "slurm.mem=lots",
        "slurm.partition=my part",
        "slurm.account=a;b",
        "slurm.extra_args=[nodash]",
    )
    assert code == 2 and out == ""
    assert "4 problems in the config" in err
    assert "slurm.mem: 'lots' is not a Slurm memory size; write e.g. 480G" in err
    assert "slurm.partition: 'my part' is not a Slurm name" in err
    assert "slurm.account: 'a;b' is not a Slurm name" in err
    assert "slurm.extra_args: 'nodash' is not an sbatch option" in err


def test_slurm_values_stop_submit_before_a_run_directory_exists(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, _, err = _cli(
        capsys,
        "submit",
        "--cluster",
        "local",
        "--run-dir",
        str(run_dir),
        "--dry-run",
        "slurm.mem=lots",
        "slurm.qos=a b",
    )
    assert code == 2 and "slurm.mem:" in err and "slurm.qos:" in err
    assert not run_dir.exists()


@pytest.mark.parametrize("command", [["train"], ["submit", "--cluster", "local", "--dry-run"]])
def test_a_config_overrides_typo_is_found_before_the_run_directory_exists(tmp_path, command):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "supertune",
            *command,
            "--run-dir",
            str(run_dir),
            "model.config_overrides=num_hiden_layers=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "model.config_overrides: 'num_hiden_layers' (did you mean num_hidden_layers?) not a field of LlamaConfig"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()


def test_a_profile_cannot_choose_another_cluster(no_user_profiles, capsys):
    no_user_profiles.mkdir(parents=True)
    (no_user_profiles / "mysite.yaml").write_text("run_config:\n  launch:\n    cluster: ibex\n")
    code, _, err = _cli(capsys, "config", "show", "launch.cluster=mysite")
    assert code == 2
    assert "run_config.launch.cluster: a profile cannot name the cluster" in err


def test_an_unknown_cluster_is_reported_with_the_other_problems(capsys):
    code, _, err = _cli(capsys, "config", "show", "launch.cluster=ibx", "training.max_steps=0")
    assert code == 2 and "2 problems in the config" in err
    assert "launch.cluster: unknown cluster 'ibx' (did you mean ibex?)" in err and "training.max_steps:" in err
