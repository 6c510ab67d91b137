"""`supertune train [CONFIG] [--run-dir DIR] [--nproc N] [section.key=value ...]`"""

from __future__ import annotations

import argparse

from .run_config_args import add_run_config_arguments, split_config_and_overrides
import json

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
        "  supertune train run.yaml --nproc 2 --run-dir runs/ddp-test\n\n"
        "config keys (YAML sections, or section.key=value on the command line):\n" + keys_reference()
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_config_arguments(p)
    p.add_argument("--run-dir", help="run directory (default: <output.runs_root>/<output.name>-<timestamp>)")
    p.add_argument("--nproc", type=int, help="processes on this machine (same as launch.nproc=N)")


def run(args: argparse.Namespace) -> int:
    from ..config import dump_config, load_run_config
    from ..launch.environment import launch_environment
    from ..rundir import create_run_dir

    config, overrides = split_config_and_overrides(args)
    if args.nproc is not None:
        overrides.append(f"launch.nproc={args.nproc}")
    cfg = load_run_config(config, overrides)
    run_dir = create_run_dir(args.run_dir, cfg.output.name, cfg.output.runs_root, dump_config(cfg))
    print(f"supertune: run dir {run_dir.path}", flush=True)
    if cfg.launch.nproc > 1 and not launch_environment().distributed:
        from ..launch.local import torchrun_argv
        from ..subprocesses import run_foreground

        code = run_foreground(torchrun_argv(cfg.launch.nproc, run_dir.path))
        if code != 0:
            print(f"supertune: error: torchrun exited with code {code}; see the output above", flush=True)
            return code
        summary = json.loads(run_dir.summary.read_text())
    else:
        from ..train.logging_setup import setup_logging
        from ..train.run import run_training

        setup_logging()
        summary = run_training(cfg, run_dir)
    if launch_environment().is_main:
        _report(summary, run_dir)
    return 0


def _report(summary: dict, run_dir) -> None:
    lines = [
        f"eval loss {summary['eval_loss']:.4f}, perplexity {summary['perplexity']:.2f}"
        + (f" (unigram baseline {summary['unigram_perplexity']:.2f})" if summary.get("unigram_perplexity") else ""),
        f"trained {summary['train_steps']} steps, {summary['train_tokens']} tokens in {summary['train_runtime_s']:.1f} s "
        f"({summary['tokens_per_second']:.0f} tokens/s)",
        f"model saved to {run_dir.model}" if run_dir.model.exists() else "model not saved (output.save_model=false)",
    ]
    if summary.get("sample"):
        lines.append(f"sample: {summary['sample']!r}")
    for line in lines:
        print(f"supertune: {line}", flush=True)
