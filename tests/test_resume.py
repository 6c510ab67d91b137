"""Never lose work: kill a real training process at every dangerous moment, run the same command
again, and get exactly the weights of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from supertune.checkpoints.layout import CheckpointDir
from supertune.checkpoints.manifest import MANIFEST_FILE, check_files, read_manifest

pytestmark = pytest.mark.slow

# 12 steps, a checkpoint every 4: kills before, between, during and after saves.
SETTINGS = [
    "training.max_steps=12",
    "training.save_steps=4",
    "training.logging_steps=1",
    "training.per_device_train_batch_size=8",
    "generate.max_new_tokens=0",
]
REQUEUE = 75


def train(
    run_dir: Path, *extra: str, fault: str | None = None, once: Path | None = None, nproc: int = 1, timeout: float = 300
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SUPERTUNE_FAULT", None)
    env.pop("SUPERTUNE_FAULT_ONCE", None)
    if fault:
        env["SUPERTUNE_FAULT"] = fault
    if once:
        env["SUPERTUNE_FAULT_ONCE"] = str(once)
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), *SETTINGS, *extra]
    if nproc > 1:
        argv += ["--nproc", str(nproc)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def error_lines(text: str) -> list[str]:
    """The one-line errors of the CLI (a progress bar may precede one on the same line)."""
    return re.findall(r"supertune: error: .*", text)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model" / "model.safetensors")


def assert_same_weights(a: Path, b: Path, tol: float = 1e-5) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    worst = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    assert worst <= tol, f"final weights differ by {worst}"
    return worst


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss; after a resume the repeated steps must agree, so the last one wins."""
    return _losses((run_dir / "metrics.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("reference") / "run"
    proc = train(run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


# One run killed at every dangerous moment in turn: each start is killed at its point and resumes
# what the previous kill left, from the checkpoint named (None: none yet, it starts again from step
# 0), so that 12 starts prove what 10 separate kill-and-resume pairs and a kill during a resume
# would (23 starts). Each start's logged losses are checked against the uninterrupted run's, and
# every published checkpoint against its manifest after each kill, so a resume that went wrong is
# caught in its own segment even when a later kill sends the run back to an older checkpoint.
LINEAGE = [
    ("step@2", None),  # before the first checkpoint
    ("step@6", None),  # between checkpoints
    ("save.begin@8", 4),
    ("save.weights@8", 4),  # during a save: weights written, optimizer not
    ("save.staged@8", 4),  # every file written, no manifest
    ("save.manifest@8", 4),  # manifest written, not yet renamed into place
    ("save.renamed@8", 4),  # in place, `latest` still names checkpoint-4
    ("resume.loaded@8", 8),  # while resuming from it; checkpoint-8 is then damaged
    ("save.published@8", 4),  # checkpoint-8 failed its check: from checkpoint-4, which saves it again
    ("step@12", 8),  # after the last step, before its save
    ("final.model@12", 8),  # final model written, no summary
    (None, 12),  # the last start finishes
]
DAMAGED_AFTER = "resume.loaded@8"
REFUSED_AFTER = "step@6"


@dataclass
class Start:
    fault: str | None
    resumes_from: int | None
    proc: subprocess.CompletedProcess
    losses: dict[int, float]  # the losses this start logged
    summary: bool  # summary.json exists after it
    bad_checkpoints: list[str]  # published checkpoints that fail their check after it


@pytest.fixture(scope="module")
def lineage(tmp_path_factory) -> tuple[Path, list[Start], dict[str, subprocess.CompletedProcess]]:
    """The run directory, each start of LINEAGE, and the other commands run on it on the way
    (other settings and --no-resume after the kill at step 6, the finished run started again)."""
    run = tmp_path_factory.mktemp("lineage") / "run"
    starts: list[Start] = []
    others: dict[str, subprocess.CompletedProcess] = {}
    for fault, resumes_from in LINEAGE:
        logged = len(_metric_lines(run))
        proc = train(run, fault=fault)
        layout = CheckpointDir(run / "checkpoints")
        bad = [path.name for _, path in layout.published() if check_files(path, read_manifest(path))]
        new = _metric_lines(run)[logged:]
        starts.append(Start(fault, resumes_from, proc, _losses(new), (run / "summary.json").exists(), bad))
        if fault == REFUSED_AFTER:
            others["other_settings"] = train(run, "training.learning_rate=0.01")
            others["no_resume"] = train(run, "--no-resume")
        if fault == DAMAGED_AFTER:
            # same size, one byte changed: only the sha256 can tell
            with (run / "checkpoints" / "checkpoint-8" / "optimizer.pt").open("r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0xFF]))
    others["finished"] = train(run)
    return run, starts, others


def _metric_lines(run_dir: Path) -> list[str]:
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().splitlines() if metrics.exists() else []


def _losses(lines: list[str]) -> dict[int, float]:
    """Per-step training loss of these metrics.jsonl lines, the last one of a step winning."""
    out: dict[int, float] = {}
    for line in lines:
        record = json.loads(line)
        if "loss" in record and "event" not in record:
            out[record["step"]] = record["loss"]
    return out


def test_killed_at_every_dangerous_moment_in_turn_the_same_command_resumes_to_the_uninterrupted_weights(
    reference, lineage
):
    run, starts, _ = lineage
    ref_losses = losses(reference)
    for n, start in enumerate(starts):
        out, err = start.proc.stdout, start.proc.stderr
        where = f"start {n} (killed at {start.fault})"
        if start.fault:
            assert start.proc.returncode == -signal.SIGKILL, (where, out + err)
            assert not start.summary, where
        else:
            assert start.proc.returncode == 0, (where, out + err)
        if n:
            assert "resuming the run" in out, (where, out)
        resumed = re.findall(r"resuming from (checkpoint-\d+):", err)
        assert resumed == ([f"checkpoint-{start.resumes_from}"] if start.resumes_from else []), (where, err)
        assert start.bad_checkpoints == [], where
        assert all(abs(loss - ref_losses[step]) <= 1e-5 for step, loss in start.losses.items()), (where, start.losses)
    assert_same_weights(run, reference)
    run_losses = losses(run)
    assert run_losses.keys() == ref_losses.keys()
    assert max(abs(run_losses[s] - ref_losses[s]) for s in ref_losses) <= 1e-5
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_steps"] == 12
    straight = json.loads((reference / "summary.json").read_text())
    assert (summary["train_tokens"], summary["train_loss_tokens"]) == (
        straight["train_tokens"],
        straight["train_loss_tokens"],
    )
    # no unfinished save left behind, every published checkpoint passes its check
    layout = CheckpointDir(run / "checkpoints")
    assert not layout.staging_root.exists()
    for _, path in layout.published():
        assert check_files(path, read_manifest(path)) == []


def test_kill_during_resume_and_a_damaged_checkpoint(reference, lineage):
    """Killed while resuming from checkpoint-8, that checkpoint then damaged: the next start falls back
    to the previous good checkpoint (with a warning) and the run still ends with the same weights."""
    run, starts, _ = lineage
    [killed] = [s for s in starts if s.fault == DAMAGED_AFTER]
    assert killed.proc.returncode == -signal.SIGKILL and "resuming from checkpoint-8:" in killed.proc.stderr
    after = starts[starts.index(killed) + 1]
    assert "checkpoint-8 is not usable (optimizer.pt: sha256 differs from the manifest)" in after.proc.stderr
    assert "resuming from checkpoint-4" in after.proc.stderr
    assert_same_weights(run, reference)


def test_resume_refuses_other_settings_and_no_resume(lineage):
    _, _, others = lineage
    other = others["other_settings"]
    assert other.returncode == 2
    assert "training.learning_rate: 0.002 -> 0.01" in other.stdout + other.stderr
    assert len((other.stdout + other.stderr).strip().splitlines()) == 1
    refused = others["no_resume"]
    assert refused.returncode == 2 and "--no-resume" in refused.stdout + refused.stderr
    # a finished run is left alone
    done = others["finished"]
    assert done.returncode == 0 and "already finished" in done.stdout


def test_checkpoint_describes_itself(reference):
    layout = CheckpointDir(reference / "checkpoints")
    assert [step for step, _ in layout.published()] == [8, 12]  # training.save_total_limit=2
    assert layout.latest() == layout.final(12)
    manifest = read_manifest(layout.final(12))
    assert (manifest.step, manifest.samples_seen, manifest.world_size, manifest.global_batch) == (12, 96, 1, 8)
    assert manifest.tokens_seen == json.loads((reference / "summary.json").read_text())["train_tokens"]
    # Packed text trains every token but the first of each sequence, which predicts nothing.
    assert manifest.loss_tokens == manifest.tokens_seen - manifest.samples_seen
    assert json.loads((reference / "summary.json").read_text())["train_loss_tokens"] == manifest.loss_tokens
    for name in (
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        "config.yaml",
    ):
        assert name in manifest.files, name
    assert MANIFEST_FILE not in manifest.files
    assert check_files(layout.final(12), manifest) == []


def _wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.exists() and any(
            json.loads(line).get("step", 0) >= step for line in metrics.read_text().splitlines()
        ):
            return
        assert proc.poll() is None, "training ended before the signal"
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout} s")


# The signal tests need a run still training when the signal arrives: 40 steps. They save only when
# signalled; how often a run saves does not change its weights.
LONG = ["training.max_steps=40"]
SIGNAL_ONLY = ["training.save_steps=100"]


@pytest.fixture(scope="module")
def two_process_straight(tmp_path_factory) -> Path:
    """An uninterrupted 2-process run of 40 steps, the end the SIGTERM and torchrun-restart tests must reach."""
    run = tmp_path_factory.mktemp("two_process_straight") / "run"
    proc = train(run, *LONG, *SIGNAL_ONLY, nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def test_signal_checkpoints_stops_and_the_same_command_resumes(tmp_path, two_process_straight):
    """SIGTERM to a 2-process run (torchrun passes it to both ranks): a checkpoint, exit code REQUEUE,
    and the same command resumes to the uninterrupted run's weights. SIGUSR1, which the same handler
    takes, is Slurm's warning before a time limit: tests/test_slurm_requeue.py sends it to a real job."""
    sig, nproc = signal.SIGTERM, 2
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run), "--nproc", str(nproc), *SETTINGS]
    argv += [*LONG, *SIGNAL_ONLY]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_step(run, 3, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE, out
    stopped = json.loads((run / "stopped.json").read_text())
    step = stopped["step"]
    assert 3 <= step < 40 and "Run the same command again to resume" in out
    layout = CheckpointDir(run / "checkpoints")
    assert layout.latest() == layout.final(step)
    assert read_manifest(layout.final(step)).reason == stopped["reason"]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming from checkpoint-{step}" in again.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_steps"] == 40 and summary["resumed_from_step"] == step
    # an uninterrupted run of the same settings ends with the same weights
    assert_same_weights(run, two_process_straight)


def test_nan_stops_the_run_naming_the_step(tmp_path):
    run = tmp_path / "run"
    proc = train(
        run,
        "training.learning_rate=1e6",
        "training.max_grad_norm=0",
        "training.warmup_steps=0",
        "training.save_steps=1",
    )
    assert proc.returncode == 2
    error = error_lines(proc.stdout + proc.stderr)
    assert len(error) == 1 and "became NaN or Inf at step 2" in error[0] and "checkpoint-1" in error[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    layout = CheckpointDir(run / "checkpoints")
    assert [s for s, _ in layout.published()] == [1] and layout.latest() == layout.final(1)
    assert check_files(layout.final(1), read_manifest(layout.final(1))) == []


def test_a_dead_rank_ends_the_run_within_the_timeout(tmp_path):
    run = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "supertune",
        "train",
        "--run-dir",
        str(run),
        "--nproc",
        "2",
        *SETTINGS,
        "training.max_steps=400",
        "training.ddp_timeout=1800",  # a run waiting for it would meet communicate's timeout first
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for_step(run, 2, proc)
        torchrun = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(torchrun) == 1
        workers = subprocess.run(["pgrep", "-P", torchrun[0]], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2
        os.kill(int(workers[-1]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode not in (0, REQUEUE), out
    # Ended by the dead rank, not by the collective timeout: torchrun names the killed rank, and no
    # process waited its ddp_timeout out (gloo would say "Timed out waiting ...").
    assert re.search(r"training processes failed \(.*rank \d exit -9", out) and "Timed out" not in out, out[-3000:]
    assert not subprocess.run(["pgrep", "-f", f"supertune.entry train-worker {run}"], capture_output=True).stdout


def test_full_disk_stops_before_the_checkpoint(tmp_path):
    """On a 24 MB file system the first checkpoint (15 MB) fits and the second does not."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"cannot mount a small tmpfs with CI set: {made.stderr.strip()}")
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    try:
        run = mount / "run"
        proc = train(run, "output.save_model=false")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        error = error_lines(out)
        assert len(error) == 1 and "checkpoint at step 8 needs about" in error[0] and "free" in error[0], out
        layout = CheckpointDir(run / "checkpoints")
        assert [s for s, _ in layout.published()] == [4]
        assert check_files(layout.final(4), read_manifest(layout.final(4))) == []
        assert not layout.staging_root.exists() or not any(layout.staging_root.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_submit_again_resumes_the_same_run_dir(tmp_path):
    """`supertune submit --run-dir DIR` on an unfinished run renders its job again (here: --dry-run)."""
    run = tmp_path / "run"

    def submit(*extra: str) -> subprocess.CompletedProcess:
        argv = [
            sys.executable,
            "-m",
            "supertune",
            "submit",
            "--cluster",
            "local",
            "--dry-run",
            "--run-dir",
            str(run),
            *extra,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    first = submit("training.max_steps=50")
    assert first.returncode == 0 and first.stdout.startswith("#!/bin/bash"), first.stderr
    again = submit("training.max_steps=80", "slurm.time=02:00:00")
    assert again.returncode == 0 and "resuming the run in" in again.stderr, again.stderr
    assert "#SBATCH --time=02:00:00" in again.stdout
    other = submit("data.block_size=64")
    assert other.returncode == 2 and "data.block_size: 128 -> 64" in other.stderr


def test_deepspeed_zero2_two_processes_resume_exactly(tmp_path):
    """DeepSpeed writes its own per-rank files into the checkpoint; a SIGKILL of rank 0 and a resume
    still end with the weights of the uninterrupted run."""
    zero2 = ("distributed.strategy=zero2",)
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert train(straight, *zero2, nproc=2).returncode == 0
    killed = train(run, *zero2, fault="save.staged@8", nproc=2)
    assert killed.returncode != 0 and not (run / "summary.json").exists()
    resumed = train(run, *zero2, nproc=2)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from checkpoint-4" in resumed.stdout + resumed.stderr
    assert_same_weights(run, straight)
    manifest = read_manifest(CheckpointDir(run / "checkpoints").final(12))
    assert any(name.startswith("global_step12/") for name in manifest.files)  # DeepSpeed's partitions
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(manifest.files)


def test_torchrun_restarts_a_dead_rank_and_the_run_resumes(tmp_path, two_process_straight):
    """launch.max_restarts=1: rank 1 dies at step 6, torchrun starts both processes again, they resume
    from checkpoint-4 and the run ends as if nothing happened."""
    run = tmp_path / "run"
    proc = train(run, *LONG, "launch.max_restarts=1", fault="step@6:1", once=tmp_path / "fired", nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "fired").exists()
    assert "resuming from checkpoint-4" in proc.stdout + proc.stderr
    assert_same_weights(run, two_process_straight)
