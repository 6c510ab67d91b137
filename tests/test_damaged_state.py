"""supertune's own files, damaged by a full disk, a killed process or a hand edit: every reader
answers with one line naming the file, the damage and what to do; no word from a file reaches a
Slurm command as an option; a rejected checkpoint is never deleted by rotation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supertune.checkpoints.layout import CheckpointDir
from supertune.cli.main import main
from supertune.errors import UserError
from supertune.slurm.commands import cancel_job, job_state, requeue_job

JOB = {"job_id": "12", "cluster": "local", "submitted_at": 1.5}
METRIC = {"step": 1, "loss": 2.5, "learning_rate": 1e-3, "tokens_seen": 512, "throughput_tokens_per_s": 9.0, "mfu": 0.1}
SUMMARY = {"eval_loss": 2.0, "perplexity": 7.4, "train_steps": 2, "train_tokens": 1024, "world_size": 1, "mfu": None}
SWEEP_RUN = {
    "devices": 1, "nodes": 1, "per_node": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
    "run_dir": "devices-1", "job_id": None, "state": "finished",
}  # fmt: skip
SWEEP = {
    "sweep": 1, "mode": "local", "keep": "global-batch", "scaling": "strong", "config": None, "overrides": [],
    "cluster": None, "runs": [SWEEP_RUN], "created": 1.0, "command": "supertune sweep",
}  # fmt: skip


def _line(record: object) -> bytes:
    return (json.dumps(record) + "\n").encode()


# (file, its damaged bytes, the damage the error names)
JOBS_DAMAGE = [
    (b"\xff\xfe{}\n", "not UTF-8 text at byte 0"),
    (_line({k: v for k, v in JOB.items() if k != "cluster"}), "no cluster"),
    (_line({**JOB, "user": "x"}), "a field supertune does not write: user"),
    (_line({**JOB, "submitted_at": "now"}), "submitted_at is 'now', not a number"),
    (_line({**JOB, "job_id": "--me"}), "job_id is '--me', not a job id (digits)"),
    (_line({**JOB, "job_id": "-u"}), "job_id is '-u', not a job id (digits)"),
    (_line({**JOB, "job_id": "*"}), "job_id is '*', not a job id (digits)"),
    (_line({**JOB, "job_id": 12}), "job_id is 12, not a job id (digits)"),
    (_line([1, 2]), "a JSON array, not an object"),
    (_line(JOB)[:20], "not JSON"),
]
METRICS_DAMAGE = [
    (_line({k: v for k, v in METRIC.items() if k != "step"}), "record 1 is damaged (no step)"),
    (_line({**METRIC, "loss": "high"}), "record 1 is damaged (loss is 'high', not a number)"),
    (_line({**METRIC, "step": 1.5}), "record 1 is damaged (step is 1.5, not a whole number)"),
    (_line({**METRIC, "step": -1}), "record 1 is damaged (step is -1, not a whole number of at least 0)"),
    (
        _line({**METRIC, "throughput_tokens_per_s": -9.0}),
        "record 1 is damaged (throughput_tokens_per_s is -9.0, not a number of at least 0)",
    ),
]
SUMMARY_DAMAGE = [
    (_line({**SUMMARY, "eval_loss": "2.0"}), "is damaged (eval_loss is '2.0', not a number)"),
    (_line({**SUMMARY, "world_size": "two"}), "is damaged (world_size is 'two', not a whole number)"),
    (b"[1]", "is a JSON list, not an object"),
    (_line({**SUMMARY, "world_size": 0}), "is damaged (world_size is 0, not a whole number of at least 1)"),
    (_line({**SUMMARY, "nodes": 0}), "is damaged (nodes is 0, not a whole number of at least 1)"),
    (_line({**SUMMARY, "train_tokens": -1024}), "is damaged (train_tokens is -1024, not a whole number of at least 0)"),
    (_line({**SUMMARY, "mfu": -0.5}), "is damaged (mfu is -0.5, not a number of at least 0)"),
]
CONFIG_DAMAGE = [
    (b"training:\n  - per_device_train_batch_size: 4\n", "is damaged (training is a list, not a mapping of settings)"),
    (b"training: 4\n", "is damaged (training is a number, not a mapping of settings)"),
    (b"training:\n", "is damaged (training is empty, not a mapping of settings)"),
    (
        b"training:\n  per_device_train_batch_size: four\n",
        "is damaged (training.per_device_train_batch_size is 'four', not a whole number)",
    ),
    (
        b"training:\n  gradient_accumulation_steps: 0\n",
        "is damaged (training.gradient_accumulation_steps is 0, not a whole number of at least 1)",
    ),
]
SWEEP_DAMAGE = [
    (_line({**SWEEP, "runs": {"devices-1": SWEEP_RUN}}), "runs is {"),
    (_line({**SWEEP, "runs": [{k: v for k, v in SWEEP_RUN.items() if k != "devices"}]}), "runs[0]: no devices"),
    (_line({**SWEEP, "runs": [{**SWEEP_RUN, "job_id": "--me"}]}), "runs[0]: job_id is '--me', not a job id"),
    (_line({**SWEEP, "overrides": [1]}), "overrides holds a value that is not text"),
    (
        _line({**SWEEP, "runs": [{**SWEEP_RUN, "devices": 0}]}),
        "runs[0]: devices is 0, not a whole number of at least 1",
    ),
    (_line({**SWEEP, "extra": 1}), "a field supertune does not write: extra"),
    (_line([SWEEP]), "a JSON array, not an object"),
    (b"\xc3\x28", "not UTF-8 text at byte 0"),
]

CASES = (
    [(cmd, "jobs.jsonl", data, how) for cmd in ("status", "cancel", "logs") for data, how in JOBS_DAMAGE]
    + [("report", "metrics.jsonl", data, how) for data, how in METRICS_DAMAGE]
    + [("report", "summary.json", data, how) for data, how in SUMMARY_DAMAGE]
    + [("report", "sweep.json", data, how) for data, how in SWEEP_DAMAGE]
    + [("report", "config.yaml", data, how) for data, how in CONFIG_DAMAGE]
)


def _run_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("training:\n  per_device_train_batch_size: 4\n")
    (path / "jobs.jsonl").write_bytes(_line(JOB))
    (path / "metrics.jsonl").write_bytes(_line(METRIC) + _line({**METRIC, "step": 2, "mfu": None}))
    (path / "summary.json").write_bytes(_line(SUMMARY))
    return path


@pytest.mark.parametrize(
    ("command", "name", "data", "how"), CASES, ids=[f"{c}-{n}-{i}" for i, (c, n, _, _) in enumerate(CASES)]
)
def test_a_damaged_state_file_is_one_line_naming_it_the_damage_and_the_fix(
    command: str, name: str, data: bytes, how: str, tmp_path: Path, capsys
) -> None:
    sweep = tmp_path / "sweep"
    run = _run_dir(sweep / "devices-1")
    (sweep / "sweep.json").write_bytes(_line(SWEEP))
    damaged = (sweep if name == "sweep.json" else run) / name
    damaged.write_bytes(data)
    target = sweep if name == "sweep.json" else run
    args = {"report": ["report", str(target), "--out", str(tmp_path / "report")]}.get(command, [command, str(run)])
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1, err
    assert str(damaged) in err and how in err, err
    assert "is damaged" in err or "not an object" in err
    assert any(fix in err for fix in ("remove", "restore", "train the run again")), err


def test_sound_files_with_an_unmeasured_mfu_make_a_report(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path / "run")
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0, capsys.readouterr().err
    assert (tmp_path / "report" / "report.md").is_file()


@pytest.mark.parametrize("word", ["--me", "-u", "*", "12 13", "", "１２"])
def test_no_word_that_is_not_a_job_id_reaches_a_slurm_command(word: str) -> None:
    for command in (cancel_job, job_state, requeue_job):
        with pytest.raises(UserError, match="is not a Slurm job id"):
            command(word)


def test_logs_refuses_a_job_id_pattern(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path / "run")
    (run / "logs").mkdir()
    (run / "logs" / "supertune-99.out").write_text("another job's log\n")
    assert main(["logs", str(run), "--job", "*"]) == 2
    out, err = capsys.readouterr()
    assert "another job's log" not in out and "--job: * is not a job of" in err


def test_rotation_never_deletes_a_rejected_checkpoint(tmp_path: Path) -> None:
    layout = CheckpointDir(tmp_path / "checkpoints")
    for step in (1, 2, 3):
        ckpt = layout.root / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"weights")
        (ckpt / "supertune-checkpoint.json").write_text("{ damaged")  # the manifest's JSON only
    (layout.root / ".rejected-checkpoint-3").mkdir()  # kept from an earlier start
    (layout.root / "latest").write_text("checkpoint-3\n")
    assert layout.resumable() is None  # every one fails its check: moved aside
    layout.rotate(1)
    kept = sorted(p.name for p in layout.root.iterdir() if p.name.startswith(".rejected-"))
    assert kept == [
        ".rejected-checkpoint-1",
        ".rejected-checkpoint-2",
        ".rejected-checkpoint-3",
        ".rejected-checkpoint-3-2",
    ]
    assert (layout.root / ".rejected-checkpoint-3-2" / "model.safetensors").read_bytes() == b"weights"


def test_scontrol_answering_garbage_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """A real scontrol cannot be made to answer garbage: a stand-in on PATH does, as a damaged
    controller or a wrapper printing its own text would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'JobId=12 JobState=RUNNING Restarts=lots \x01garbage'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    run = _run_dir(tmp_path / "run")
    assert main(["status", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "supertune: error: scontrol show job 12: Slurm answered Restarts='lots', not a number; check Slurm with `scontrol ping`"
    ]


def test_scontrol_answering_bytes_that_are_not_utf8(tmp_path: Path, capsys, monkeypatch) -> None:
    """Bytes that are not UTF-8 in scontrol's answer are read, not a UnicodeDecodeError: in a field
    that is only shown (the reason) they show as U+FFFD; in the job state, which decides what happens
    to the job, they are one line naming the field and the value."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    run = _run_dir(tmp_path / "run")
    scontrol.write_bytes(b"#!/bin/sh\nprintf 'JobId=12 JobState=PENDING Reason=Pri\\377rity Restarts=0\\n'\n")
    scontrol.chmod(0o755)
    assert main(["status", str(run)]) == 0, capsys.readouterr().err
    assert "Pri\ufffdrity" in capsys.readouterr().out
    scontrol.write_bytes(b"#!/bin/sh\nprintf 'JobId=12 JobState=RUNN\\377ING Restarts=0\\n'\n")
    assert main(["status", str(run)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "supertune: error: scontrol show job 12: Slurm answered JobState='RUNN\ufffdING', not a job state; "
        "check Slurm with `scontrol ping`"
    ]


def test_evaluating_a_runs_model_with_a_damaged_config_is_one_line(tmp_path: Path, capsys) -> None:
    """`supertune eval` takes the data and the seed of the model's run from its config.yaml: a section
    that is not a mapping is refused naming the file, before any model is loaded."""
    run = _run_dir(tmp_path / "run")
    (run / "model").mkdir()
    (run / "config.yaml").write_text("data: {}\ntraining:\n  - seed: 1\n")
    assert main(["eval", str(run / "model")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"supertune: error: {run}/config.yaml: is damaged (training is a list, not a mapping of settings); "
        "supertune writes it when a run starts: restore it, or copy the model out of the run"
    ]


STOPPED = {"stopped": True, "reason": "SIGUSR1", "step": 4, "checkpoint": "checkpoint-4", "unix_time": 1.0}


@pytest.mark.parametrize(
    ("content", "damage"),
    [
        (_line([STOPPED]), "a JSON list, not an object"),
        (_line(STOPPED)[:15], "not JSON"),
        (_line({k: v for k, v in STOPPED.items() if k != "checkpoint"}), "no checkpoint"),
        (_line({**STOPPED, "step": "four"}), "step is 'four', not a whole number"),
    ],
)
def test_a_damaged_stop_record_is_one_line_naming_the_fix(tmp_path: Path, content: bytes, damage: str) -> None:
    """stopped.json is what `supertune train` reads to say where a stopped run resumes from."""
    from supertune.rundir import RunDir

    run = RunDir(tmp_path)
    assert run.read_stopped("run directory") is None
    run.stopped.write_bytes(content)
    with pytest.raises(UserError) as caught:
        run.read_stopped("run directory")
    message = str(caught.value)
    assert message.startswith(f"run directory: {run.stopped} is ") and damage in message, message
    assert "delete it and run the same command again" in message and "\n" not in message
    run.stopped.write_bytes(_line(STOPPED))
    assert run.read_stopped("run directory") == STOPPED


def test_squeue_answering_what_is_not_a_job_id_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """The ids squeue lists go on to scontrol and scancel: a stand-in squeue prints a banner line, as
    a site's wrapper might, and an array task's id; neither reaches another command."""
    from supertune.slurm.commands import named_jobs

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    squeue.write_text("#!/bin/sh\nprintf '12\\n 13 \\n'\n")
    squeue.chmod(0o755)
    assert named_jobs("site-a") == ["12", "13"]
    for answer, shown in (("Welcome to the cluster", "'Welcome to the cluster'"), ("14_[1-3]", "'14_[1-3]'")):
        squeue.write_text(f"#!/bin/sh\nprintf '12\\n{answer}\\n'\n")
        with pytest.raises(UserError) as caught:
            named_jobs("site-a")
        assert str(caught.value) == (
            f"squeue --name=site-a: Slurm answered {shown}, not a job id (digits); check Slurm with `squeue --me`"
        )
