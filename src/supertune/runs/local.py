"""A run trained on this machine, and how it ended.

`train_here` trains in this process, or, for several processes, is the parent of torchrun's (a stop
signal to this process becomes the run's stop-request file, which the workers read: torchrun's
agent is left alone, since it would pass SIGTERM on with a 30 s limit and SIGUSR1 kills it).
`train_logged` trains in processes of their own with their output in a log: the sweep's scales and
a federation's local sites, which run one training after another. Either way the outcome is read
from the run directory (summary.json, the stop record), not from the processes' output.
Importing this module is cheap: `supertune train` installs the signal handlers through it first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..exit_codes import REQUEUE_EXIT_CODE
from ..rundir import RunDir
from ..train.trainer.signals import clear_stop_files, install_signal_handlers, request_stop
from .run_dir_choice import choose_run_dir

if TYPE_CHECKING:
    from ..config.schema import RunConfig
    from ..resolve.resolve import Resolution

__all__ = ["LocalOutcome", "forward_stop_signals", "check_local_start", "train_here", "train_logged", "summary_lines"]


@dataclass(frozen=True)
class LocalOutcome:
    """How a local run ended: finished (its summary), stopped on request after a checkpoint, or failed."""

    run: RunDir
    code: int
    """Exit code of the training processes (0 for training in this process)."""
    summary: dict | None
    """summary.json (or, trained in this process, the summary training returned); None: not finished."""
    stopped: dict | None = None
    """The stop record (step, reason, checkpoint) of a run that stopped on request."""
    late: bool = False
    """The processes were ended at the deadline given to train_logged (`until`), unfinished."""

    @property
    def exit_code(self) -> int:
        """What `supertune train` exits with: REQUEUE_EXIT_CODE after a stop (run it again to resume),
        the processes' code after a failure, 1 when they ended without a summary."""
        if self.stopped is not None:
            return REQUEUE_EXIT_CODE
        if self.code != 0:
            return self.code
        return 0 if self.summary is not None else 1


def forward_stop_signals() -> list[RunDir]:
    """From now on, SIGUSR1 and SIGTERM to this process ask every run in the returned list (append
    the run once it is known) to checkpoint and stop. Call it before heavy imports: SIGUSR1's
    default action would end the process."""
    runs: list[RunDir] = []

    def pass_on(_signal: str) -> None:
        for run in runs:
            request_stop(run)

    install_signal_handlers(also=pass_on)
    return runs


def check_local_start(cfg: RunConfig, gpus: bool = True) -> None:
    """Before a run directory exists: the launch environment and the cache path readable, TMPDIR
    writable, GPUs this PyTorch cannot use (`gpus`; it imports torch, which the training processes
    check again), the weights the run starts from against their manifest (sha256 up to 4 GiB, sizes
    above): a damaged model is refused without leaving a run behind; and the rows of conversational
    data (training_data.row_checks)."""
    from ..checkpoints.model_files import check_saved_model
    from ..launch.environment import launch_environment, slurm_allocation
    from ..paths import cache_dir

    # A garbage launcher variable or cache path is a one-line UserError here, before any import of torch.
    launch_environment()
    slurm_allocation()
    cache_dir()
    from ..doctor.startup import refuse_unfit_node

    refuse_unfit_node(gpus)  # a TMPDIR compilers cannot write into; a GPU job that would train on the CPU
    if gpus and cfg.training.float8:
        from ..modeling.float8 import refuse_float8_device

        refuse_float8_device()  # a card without float8 matmuls, before a run directory exists
    m = cfg.model
    if m.name_or_path and not m.from_config:
        check_saved_model(os.path.expanduser(m.name_or_path), "model.name_or_path", "auto", tokenizer=False)
    check_hub_references(cfg)  # before the row checks below, which load the tokenizer
    if cfg.data.format != "text" and not cfg.data.store:
        # A bad conversation, or a chat template that cannot mark the answers, is refused with its row
        # in the files (seconds: the tokenizer loads, the first rows are rendered).
        from ..modeling.tokenizer import load_tokenizer
        from ..training_data.row_checks import check_rows_before_start

        check_rows_before_start(cfg.data, load_tokenizer(cfg))


def check_hub_references(cfg: RunConfig) -> None:
    """A hub model, tokenizer or dataset that this machine can neither find in its cache nor fetch
    is refused (UserError) before a run directory exists, rather than by the training after it. Costs
    a cache lookup, and a TCP probe of the hub of at most a few seconds when a reference is not cached."""
    from ..documents.sources import check_hub_dataset
    from ..hub import resolve_reference

    m = cfg.model
    if m.name_or_path and not (m.bundle and m.from_config):  # else the bundle's config stands in for it
        resolve_reference(m.name_or_path, "model.name_or_path", "config.json", m.revision)
    if m.tokenizer not in (None, "train") and m.bundle is None:
        resolve_reference(m.tokenizer, "model.tokenizer", "tokenizer_config.json", m.revision)
    check_hub_dataset(cfg.data)


def train_here(cfg: RunConfig, run: RunDir, watched: list[RunDir]) -> LocalOutcome:
    """Train `run` in the foreground: in this process, or as the parent of launch.nproc processes under
    torchrun (unless a launcher started this process already). The run joins `watched` (from
    forward_stop_signals) once the previous attempt's stop files are gone."""
    from ..launch.environment import launch_environment

    clear_stop_files(run)
    watched.append(run)
    if cfg.launch.nproc > 1 and not launch_environment().distributed:
        from ..subprocesses import run_foreground

        _warn_threads(
            cfg.launch.nproc, os.environ.get("OMP_NUM_THREADS"), lambda line: print(line, file=sys.stderr, flush=True)
        )
        return _outcome(run, run_foreground(_argv(cfg, run), _quiet_torchrun(None)))
    from ..train.lifecycle.logging_setup import setup_logging
    from ..train.lifecycle.run import run_training

    setup_logging()
    summary = run_training(cfg, run)
    return LocalOutcome(run, 0, summary, summary if summary.get("stopped") else None)


def train_logged(
    resolution: Resolution,
    run_dir: Path,
    log: Path,
    no_resume: bool = False,
    env: Mapping[str, str] | None = None,
    until: float | None = None,
) -> LocalOutcome:
    """Train the run in `run_dir` (new, or resumed unless `no_resume`) in processes of their own, their
    output appended to `log`: one training worker, or torchrun's. A run found finished is not started.
    The processes die with this one (a killed federation leaves no training behind); with `until` (unix
    time) they are ended when it passes, and the outcome is `late`."""
    from ..subprocesses import run_logged, run_logged_until

    cfg = resolution.config
    check_local_start(cfg, gpus=False)  # the workers check their GPUs themselves
    choice = choose_run_dir(str(run_dir), resolution, no_resume)
    _note(log, f"supertune: {choice.message}")
    if choice.finished:
        return LocalOutcome(choice.run, 0, choice.run.read_summary("run directory"))
    clear_stop_files(choice.run)
    if cfg.launch.nproc > 1:
        threads = (env or {}).get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
        _warn_threads(cfg.launch.nproc, threads, lambda line: _note(log, line))
    argv, child_env = _argv(cfg, choice.run), _quiet_torchrun(env) if cfg.launch.nproc > 1 else env
    code = run_logged(argv, log, child_env) if until is None else run_logged_until(argv, log, until, child_env)
    if code is None:
        _note(log, "supertune: ended at the deadline, unfinished")
        return LocalOutcome(choice.run, 1, None, late=True)
    outcome = _outcome(choice.run, code)
    for line in summary_lines(outcome.summary, outcome.run) if outcome.summary else []:
        _note(log, line)  # the log ends as `supertune train`'s output does
    return outcome


def _quiet_torchrun(env: Mapping[str, str] | None) -> dict[str, str]:
    """torchrun's environment with OMP_NUM_THREADS=1 where it is unset: what torchrun would set itself,
    without its banner about setting it (the thread count is checked by _warn_threads)."""
    merged = dict(env or {})
    if "OMP_NUM_THREADS" not in merged and "OMP_NUM_THREADS" not in os.environ:
        merged["OMP_NUM_THREADS"] = "1"
    return merged


def _eval_line(summary: dict) -> str:
    if summary.get("perplexity") is None:
        # A preference objective: its loss is no token loss; the share of held-out pairs preferred
        # rightly and the mean reward margin say more.
        line = f"eval loss {summary['eval_loss']:.4f} (training.objective={summary.get('objective')})"
        if "eval_rewards/accuracies" in summary:
            line += f", preference accuracy {summary['eval_rewards/accuracies']:.3f}"
        if "eval_rewards/margins" in summary:
            line += f", mean reward margin {summary['eval_rewards/margins']:.4f}"
        return line + " on the validation rows"
    return (
        f"eval loss {summary['eval_loss']:.4f}, perplexity {summary['perplexity']:.2f}"
        + (f" over the {summary['loss_on']} tokens" if summary.get("loss_on", "all") != "all" else "")
        + (f" (unigram baseline {summary['unigram_perplexity']:.2f})" if summary.get("unigram_perplexity") else "")
    )


def summary_lines(summary: dict, run: RunDir) -> list[str]:
    """What a finished run says last: eval loss and perplexity, steps and tokens, where the model is."""
    lines = [
        _eval_line(summary),
        f"trained {summary['train_steps']} steps, {summary['train_tokens']} tokens"
        + (
            f", the loss on {summary['train_loss_tokens']} of them"
            if summary.get("train_loss_tokens") is not None
            else ""
        )
        + (
            f" (resumed at step {summary['resumed_from_step']}; "
            if summary.get("resumed_from_step") is not None
            else " ("
        )
        + f"{summary['train_runtime_s']:.1f} s of training in this process, {summary['tokens_per_second']:.0f} tokens/s)",
        f"model saved to {run.model}" if run.model.exists() else "model not saved (output.save_model=false)",
    ]
    if summary.get("sample"):
        lines.append(f"sample: {summary['sample']!r}")
    return [f"supertune: {line}" for line in lines]


def _argv(cfg: RunConfig, run: RunDir) -> list[str]:
    """The training processes of a run on this machine: torchrun's for several, else one worker."""
    from ..entry import TRAIN_WORKER, entry_words
    from ..launch.local import torchrun_argv

    if cfg.launch.nproc > 1:
        return torchrun_argv(cfg.launch.nproc, [str(run.path)], max_restarts=cfg.launch.max_restarts)
    return [sys.executable, *map(str, entry_words(TRAIN_WORKER, [str(run.path)]))]


def _outcome(run: RunDir, code: int) -> LocalOutcome:
    """The outcome of processes that have exited with `code`, from the files they left."""
    stopped = run.read_stopped("run directory")
    summary = run.read_summary("run directory") if stopped is None and code == 0 else None
    return LocalOutcome(run, code, summary, stopped)


def _warn_threads(nproc: int, omp_num_threads: str | None, say: Callable[[str], None]) -> None:
    from ..launch.local import thread_oversubscription

    warning = thread_oversubscription(nproc, omp_num_threads, len(os.sched_getaffinity(0)))
    if warning:
        say(f"supertune: warning: {warning}")


def _note(log: Path, line: str) -> None:
    """A line of supertune's own in a training log, before the processes write theirs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
