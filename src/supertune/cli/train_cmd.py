"""`supertune train [CONFIG] [--run-dir DIR] [--nproc N] [--no-resume] [section.key=value ...]`"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..rundir import RunDir
from .run_config_args import add_run_config_arguments, split_config_and_overrides

DESCRIPTION = (
    "Train a causal language model. Without CONFIG, the embedded default runs offline: a tiny Llama, "
    "a corpus and tokenizer that supertune makes itself. Overrides (section.key=value) go over the config."
)


def epilog() -> str:
    from ..config.docs import keys_reference

    return (
        "examples:\n"
        "  supertune train\n"
        "  supertune train run.yaml training.max_steps=500 data.block_size=1024\n"
        "  supertune train run.yaml --nproc 2 --run-dir runs/ddp-test\n"
        "  supertune train run.yaml --run-dir runs/ddp-test      # again: resumes from its latest checkpoint\n\n"
        "config keys (YAML sections, or section.key=value on the command line):\n" + keys_reference()
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_config_arguments(p)
    p.add_argument(
        "--run-dir",
        help="run directory (default: <output.runs_root>/<output.name>-<timestamp>); one that holds an "
        "unfinished run is resumed from its latest good checkpoint",
    )
    p.add_argument("--nproc", type=int, help="processes on this machine (same as launch.nproc=N)")
    p.add_argument(
        "--no-resume", action="store_true", help="refuse a --run-dir that already holds a run instead of resuming it"
    )


def run(args: argparse.Namespace) -> int:
    from ..exit_codes import REQUEUE_EXIT_CODE
    from ..train.signals import clear_stop_files, install_signal_handlers, request_stop

    # Before the heavy imports: SIGUSR1's default action would end this process. A signal becomes
    # the run's stop-request file too (once the run dir is known), which torchrun workers read.
    chosen: list[RunDir] = []

    def pass_on(_signal: str) -> None:
        for run in chosen:
            request_stop(run)

    install_signal_handlers(also=pass_on)

    from ..launch.environment import launch_environment
    from ..resolve import resolve

    config, overrides = split_config_and_overrides(args)
    if args.nproc is not None:
        overrides.append(f"launch.nproc={args.nproc}")
    resolution = resolve(config, overrides)
    cfg = resolution.config
    from ..doctor.startup import refuse_unusable_gpus

    refuse_unusable_gpus()  # before a run directory exists: a GPU job that would train on the CPU, or stop at its first kernel
    _check_start_model(cfg)
    run_dir = _run_dir(args, resolution)
    if run_dir is None:
        return 0
    clear_stop_files(run_dir)
    chosen.append(run_dir)
    if cfg.launch.nproc > 1 and not launch_environment().distributed:
        from ..launch.local import thread_oversubscription, torchrun_argv
        from ..subprocesses import run_foreground

        warning = thread_oversubscription(
            cfg.launch.nproc, os.environ.get("OMP_NUM_THREADS"), len(os.sched_getaffinity(0))
        )
        if warning:
            print(f"supertune: warning: {warning}", file=sys.stderr, flush=True)

        # A stop signal to this process becomes the stop-request file, which the workers read:
        # torchrun's agent is left alone (it would pass SIGTERM on with a 30 s limit, and SIGUSR1 kills it).
        code = run_foreground(
            torchrun_argv(cfg.launch.nproc, [str(run_dir.path)], max_restarts=cfg.launch.max_restarts)
        )
        stopped = _stopped_record(run_dir)
        if stopped is not None:
            return _report_stop(stopped, REQUEUE_EXIT_CODE)
        if code != 0:
            print(f"supertune: error: torchrun exited with code {code}; see the output above", flush=True)
            return code
        summary = run_dir.read_summary("run directory")
        if summary is None:
            print(
                f"supertune: error: the training processes ended without writing {run_dir.summary}; see the output above",
                flush=True,
            )
            return 1
    else:
        from ..train.logging_setup import setup_logging
        from ..train.run import run_training

        setup_logging()
        summary = run_training(cfg, run_dir)
        if summary.get("stopped"):
            return _report_stop(summary, REQUEUE_EXIT_CODE)
    if launch_environment().is_main:
        _report(summary, run_dir)
    return 0


def _check_start_model(cfg: Any) -> None:
    """The weights a run starts from, against their manifest (sha256 up to 4 GiB, sizes above), before
    a run directory exists: a damaged model is refused without leaving a run behind. Validation
    compared sizes already; loading the model checks again only in other processes."""
    from ..checkpoints.model_files import check_saved_model

    m = cfg.model
    if m.name_or_path and not m.from_config:
        check_saved_model(os.path.expanduser(m.name_or_path), "model.name_or_path", "auto", tokenizer=False)


def _run_dir(args: argparse.Namespace, resolution: Any) -> RunDir | None:
    """A new run directory, or the one named by --run-dir to resume (None: that run already finished)."""
    from .run_dir_choice import choose_run_dir

    choice = choose_run_dir(args.run_dir, resolution, args.no_resume)
    print(f"supertune: {choice.message}", flush=True)
    if choice.finished:
        _report(choice.run.read_summary("--run-dir") or {}, choice.run)
        return None
    return choice.run


def _stopped_record(run: RunDir) -> dict | None:
    return json.loads(run.stopped.read_text()) if run.stopped.exists() else None


def _report_stop(record: dict, code: int) -> int:
    print(
        f"supertune: stopped at step {record['step']} on {record['reason']}; {record['checkpoint']} is saved. "
        f"Run the same command again to resume (exit code {code})",
        flush=True,
    )
    return code


def _report(summary: dict, run_dir) -> None:
    lines = [
        f"eval loss {summary['eval_loss']:.4f}, perplexity {summary['perplexity']:.2f}"
        + (f" (unigram baseline {summary['unigram_perplexity']:.2f})" if summary.get("unigram_perplexity") else ""),
        f"trained {summary['train_steps']} steps, {summary['train_tokens']} tokens"
        + (
            f" (resumed at step {summary['resumed_from_step']}; "
            if summary.get("resumed_from_step") is not None
            else " ("
        )
        + f"{summary['train_runtime_s']:.1f} s of training in this process, {summary['tokens_per_second']:.0f} tokens/s)",
        f"model saved to {run_dir.model}" if run_dir.model.exists() else "model not saved (output.save_model=false)",
    ]
    if summary.get("sample"):
        lines.append(f"sample: {summary['sample']!r}")
    for line in lines:
        print(f"supertune: {line}", flush=True)
