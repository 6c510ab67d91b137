"""`supertune train [CONFIG] [--run-dir DIR] [--nproc N] [--no-resume] [section.key=value ...]`"""

from __future__ import annotations

import argparse

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
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show the library lines supertune silences (docs/runs.md lists them) and the Trainer's raw log records",
    )


def run(args: argparse.Namespace) -> int:
    from ..runs.local import forward_stop_signals

    # Before the heavy imports: SIGUSR1's default action would end this process. A signal becomes
    # the run's stop-request file too (once the run dir is known), which torchrun workers read.
    watched = forward_stop_signals()
    if args.verbose:
        import os

        from ..train.lifecycle.logging_setup import VERBOSE_VARIABLE

        os.environ[VERBOSE_VARIABLE] = "1"  # the workers (torchrun's too) inherit it

    from ..launch.environment import launch_environment
    from ..resolve import resolve
    from ..runs.local import check_local_start, train_here
    from ..runs.run_dir_choice import choose_run_dir

    config, overrides = split_config_and_overrides(args)
    if args.nproc is not None:
        overrides.append(f"launch.nproc={args.nproc}")
    resolution = resolve(config, overrides)
    cfg = resolution.config
    check_local_start(cfg)  # before a run directory exists
    choice = choose_run_dir(args.run_dir, resolution, args.no_resume)
    print(f"supertune: {choice.message}", flush=True)
    if choice.finished:
        _report(choice.run.read_summary("--run-dir") or {}, choice.run)
        return 0
    outcome = train_here(cfg, choice.run, watched)
    if outcome.stopped is not None:
        return _report_stop(outcome.stopped, outcome.exit_code)
    if outcome.code != 0:
        print(f"supertune: error: torchrun exited with code {outcome.code}; see the output above", flush=True)
        return outcome.exit_code
    if outcome.summary is None:
        print(
            f"supertune: error: the training processes ended without writing {choice.run.summary}; see the output above",
            flush=True,
        )
        return outcome.exit_code
    if launch_environment().is_main:
        _report(outcome.summary, choice.run)
    return 0


def _report_stop(record: dict, code: int) -> int:
    print(
        f"supertune: stopped at step {record['step']} on {record['reason']}; {record['checkpoint']} is saved. "
        f"Run the same command again to resume (exit code {code})",
        flush=True,
    )
    return code


def _report(summary: dict, run_dir) -> None:
    from ..runs.local import summary_lines

    for line in summary_lines(summary, run_dir):
        print(line, flush=True)
