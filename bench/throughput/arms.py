"""The three arms: how each is started in its own cold process and where its step records come from."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .cpu import CpuWindow, wait_until_quiet
from .measure import ArmMeasurement, StepRecord, measure, read_step_clock, read_supertune_metrics
from .prepare import Prepared
from .settings import BenchSettings

__all__ = ["ARMS", "Arm", "ArmRun", "run_arm"]

BENCH = Path(__file__).resolve().parent.parent

# No arm may take longer than this; a stuck arm should fail the benchmark, not hang it.
ARM_TIMEOUT_S = 600


@dataclass(frozen=True)
class Arm:
    key: str
    name: str
    description: str
    argv: Callable[[Prepared, BenchSettings, Path], list[str]]
    """Command line, given the shared inputs, the settings and the arm's own directory."""
    records: Callable[[Path], tuple[list[StepRecord], float | None]]
    """Step records and (if the arm has its own) the end of step 1, read from the arm's directory."""


def _supertune_argv(speed: str) -> Callable[[Prepared, BenchSettings, Path], list[str]]:
    """`supertune train` with training.speed=`speed`."""

    def argv(p: Prepared, s: BenchSettings, arm_dir: Path) -> list[str]:
        return _supertune_train(p, s, arm_dir) + [f"training.speed={speed}"]

    return argv


def _supertune_train(p: Prepared, s: BenchSettings, arm_dir: Path) -> list[str]:
    exe = Path(sys.executable).parent / "supertune"
    cli = [str(exe)] if exe.is_file() else [sys.executable, "-m", "supertune"]
    return cli + [
        "train",
        "--run-dir",
        str(arm_dir / "run"),
        f"model.tokenizer={p.tokenizer_dir}",
        f"data.train_files={p.train_txt}",
        f"data.validation_files={p.heldout_txt}",
        "data.packing=true",
        f"data.block_size={s.seq_len}",
        # After the timed window: keep the final evaluation short, skip saving and sampling.
        f"training.per_device_eval_batch_size={s.batch_size}",
        "output.save_model=false",
        "generate.prompt=",
        *s.supertune_overrides(),
    ]


def _supertune_records(arm_dir: Path) -> tuple[list[StepRecord], float | None]:
    records, first_step = read_supertune_metrics(arm_dir / "run" / "metrics.jsonl")
    return records, first_step


def _baseline_argv(script: str, length_flag: str) -> Callable[[Prepared, BenchSettings, Path], list[str]]:
    def argv(p: Prepared, s: BenchSettings, arm_dir: Path) -> list[str]:
        return [
            sys.executable,
            str(BENCH / "baselines" / script),
            "--train-file",
            str(p.train_txt),
            "--tokenizer",
            str(p.tokenizer_dir),
            "--model-config",
            str(p.model_config_dir),
            "--training-args",
            str(p.training_args_json),
            "--output-dir",
            str(arm_dir / "out"),
            length_flag,
            str(s.seq_len),
        ]

    return argv


def _baseline_records(arm_dir: Path) -> tuple[list[StepRecord], float | None]:
    return read_step_clock(arm_dir / "out" / "steps.jsonl"), None


ARMS = {
    "a": Arm(
        "a",
        "supertune",
        "`supertune train` CLI, packing (EOS between documents), block 512, training.speed=plain (the same work as (c))",
        _supertune_argv("plain"),
        _supertune_records,
    ),
    "b": Arm(
        "b",
        "padded (tutorial)",
        "Trainer, each document padded/truncated to 512, DataCollatorForLanguageModeling(mlm=False)",
        _baseline_argv("padded_trainer.py", "--max-length"),
        _baseline_records,
    ),
    "c": Arm(
        "c",
        "run_clm-style",
        "Trainer, datasets.map tokenize + datasets.map group into 512-token blocks",
        _baseline_argv("clm_group_texts.py", "--block-size"),
        _baseline_records,
    ),
    "d": Arm(
        "d",
        "supertune auto",
        "as (a), with training.speed=auto (the default: every exact speed-up the CPU allows)",
        _supertune_argv("auto"),
        _supertune_records,
    ),
}


def arm_environment(arm_dir: Path, threads: int | None = None) -> dict[str, str]:
    """A cold start: empty Hugging Face caches of the arm's own, offline, same threads for everyone."""
    env = dict(os.environ)
    if threads:
        # torch sizes its intra-op pool from these at start-up.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    hf_home = arm_dir / "hf"
    env.update(
        {
            "HF_HOME": str(hf_home),
            "HF_DATASETS_CACHE": str(hf_home / "datasets"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "SUPERTUNE_CACHE": str(arm_dir / "supertune-cache"),
            # The tokenizers library's own default, spelled out because supertune also sets it.
            "TOKENIZERS_PARALLELISM": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@dataclass(frozen=True)
class ArmRun:
    """One arm's process: its measurement, command line, and how busy the machine was around it."""

    measurement: ArmMeasurement
    argv: list[str]
    process_wall_s: float
    process_cpu_s: float
    other_cores: float | None
    """Average cores other processes kept busy while the arm ran (the machine is shared)."""
    other_cores_before: float | None
    """The same, over the second before the arm started."""


def run_arm(arm: Arm, p: Prepared, s: BenchSettings, arm_dir: Path, quiet_wait_s: float, quiet_cores: float) -> ArmRun:
    """Start the arm in a fresh process, wait for it, and measure it; exits with the log's tail on failure.

    Before it starts, waits up to quiet_wait_s for other processes to use fewer than quiet_cores.
    """
    if arm_dir.exists():
        raise SystemExit(f"train_throughput: {arm_dir} already exists; runs never reuse a directory")
    arm_dir.mkdir(parents=True)
    argv = arm.argv(p, s, arm_dir)
    env = arm_environment(arm_dir, s.threads)
    log_path = arm_dir / "output.log"
    before = wait_until_quiet(quiet_wait_s, quiet_cores)
    window = CpuWindow()
    with log_path.open("wb") as log:
        window.start()
        spawn = time.time()  # the clock time-to-first-step starts from
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait(timeout=ARM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        window.stop()
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(
            f"train_throughput: arm ({arm.key}) {arm.name} exited with {code}; last lines of {log_path}:\n{tail}"
        )
    records, first_step_end = arm.records(arm_dir)
    return ArmRun(
        measurement=measure(records, spawn, s.batch_size, s.seq_len, first_step_end),
        argv=argv,
        process_wall_s=window.wall_s,
        process_cpu_s=window.arm_cpu_s,
        other_cores=window.other_cores,
        other_cores_before=before,
    )
