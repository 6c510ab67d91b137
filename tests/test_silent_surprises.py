"""What a user did not ask for never happens silently: an epochs value is not ignored, every problem
of a config comes in one error, every command gives a value the same answer, and a run that cannot
start leaves no run directory behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_fixtures import supertune
from supertune.cli.main import main


def test_epochs_alone_win_over_the_default_max_steps(tmp_path: Path, capsys) -> None:
    (tmp_path / "run.yaml").write_text("training:\n  num_train_epochs: 2\n")
    assert main(["config", "show", str(tmp_path / "run.yaml"), "--origin"]) == 0
    out = capsys.readouterr().out
    assert "training.max_steps: -1  # training.num_train_epochs given without training.max_steps" in out
    # Both written: max_steps wins, as in the Trainer (docs/config.md says so).
    assert main(["config", "show", "training.num_train_epochs=2", "training.max_steps=5"]) == 0
    out = capsys.readouterr().out
    assert "  max_steps: 5\n" in out and "  num_train_epochs: 2.0\n" in out
    # A stream has no epochs: the epochs given alone are refused with the fix.
    assert main(["config", "show", "training.num_train_epochs=2", "data.streaming=true"]) == 2
    assert "data.streaming: a stream has no length; set training.max_steps" in capsys.readouterr().err


def test_an_unknown_key_is_reported_with_the_configs_other_problems(tmp_path: Path, capsys) -> None:
    (tmp_path / "run.yaml").write_text("training:\n  bogus: 3\n  learning_rate: -1\nslurm:\n  time: nope\n")
    assert main(["config", "show", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("supertune: error: 3 problems in the config:")
    assert "  - training.bogus: unknown key" in err
    assert "  - training.learning_rate: must be positive, got -1.0" in err
    assert "  - slurm.time: 'nope' is not a Slurm time" in err


@pytest.mark.parametrize("time", ["01:00:00\\n", "01:00:00\\nfoo", "\\n01:00:00"])
def test_a_line_break_in_slurm_time_gets_one_answer_from_every_command(tmp_path: Path, capsys, time: str) -> None:
    (tmp_path / "run.yaml").write_text(f'slurm:\n  time: "{time}"\n')
    answers = []
    for command in (
        ["config", "show"],
        ["submit", "--dry-run", "--cluster", "local", "--run-dir", str(tmp_path / "r")],
    ):
        assert main([*command, str(tmp_path / "run.yaml")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        answers.append(err)
    assert answers[0] == answers[1] and "slurm.time:" in answers[0]
    assert not (tmp_path / "r").exists()


def test_a_hub_model_or_tokenizer_not_to_be_had_leaves_no_run_directory(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    for field in ("model.name_or_path", "model.tokenizer"):
        # The tests run with HF_HUB_OFFLINE=1 and an empty cache (conftest.py).
        assert main(["train", f"{field}=nobody-here/no-model", f"output.runs_root={root}"]) == 2
        err = capsys.readouterr().err
        assert f"{field}: 'nobody-here/no-model' is not a local directory and not in the Hugging Face cache" in err
    assert not root.exists() or not any(root.iterdir())


def test_an_unreachable_hub_dataset_and_a_failed_sbatch_leave_no_run_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    root = tmp_path / "runs"
    proc = supertune("train", "data.dataset_name=nobody-here/no-data", f"output.runs_root={root}", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "data.dataset_name: the hub (http://127.0.0.1:9) cannot be reached" in proc.stderr
    # sbatch without a cluster to submit to: a real failure of the real command, at once (an empty
    # slurm.conf is refused on the spot; a missing one is retried for a minute).
    (tmp_path / "slurm.conf").write_text("")
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"), SUPERTUNE_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = supertune("submit", "--cluster", "local", f"output.runs_root={root}", env=env)
    assert proc.returncode != 0
    assert "sbatch failed" in proc.stderr and "Traceback" not in proc.stderr
    assert not root.exists() or not any(root.iterdir())
    # A --run-dir that existed before (here empty) is the user's: it stays.
    (tmp_path / "mine").mkdir()
    proc = supertune("submit", "--cluster", "local", "--run-dir", str(tmp_path / "mine"), env=env)
    assert "sbatch failed" in proc.stderr
    assert (tmp_path / "mine").is_dir()
