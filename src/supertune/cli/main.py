"""`supertune`: the table of subcommands. Importing this module must not import torch."""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "COMMANDS"]

# name -> (module under supertune.cli, one-line summary); modules are imported only when used.
COMMANDS = {
    "train": ("train_cmd", "train a model (the embedded default without a config)"),
    "eval": ("eval_cmd", "loss and perplexity of a saved model on some data"),
    "generate": ("generate_cmd", "continue a prompt with a saved model"),
    "average": ("average_cmd", "federated averaging of runs, checkpoints or models (token-weighted, streaming)"),
    "config": ("config_cmd", "show the resolved config, or every key with its meaning"),
    "clusters": ("clusters_cmd", "list the cluster profiles, or show one with the files it came from"),
    "container": ("container_cmd", "write an Apptainer definition and a conda environment for a cluster"),
    "submit": ("submit_cmd", "render a run's SLURM job script and submit it (or --dry-run)"),
    "status": ("status_cmd", "SLURM state of a run's jobs"),
    "logs": ("logs_cmd", "print (or --follow) the job log of a run"),
    "cancel": ("cancel_cmd", "cancel a run's unfinished SLURM jobs"),
    "federate": ("federate_cmd", "federated training across sites: rounds of local training and averaging, resumable"),
    "prepare": ("prepare_cmd", "tokenize a run config's data once into a checked, memory-mapped token store"),
    "env": ("env_cmd", "this process's rank, world size, master address and launcher, as supertune sees them"),
    "doctor": ("doctor_cmd", "check this node's environment and name the fix; --comm measures the interconnect"),
    "sweep": (
        "sweep_cmd",
        "the same run at several scales (SLURM jobs or local processes), grouped for `supertune report`",
    ),
    "report": (
        "report_cmd",
        "table and plots of a sweep or of runs: throughput, speedup, scaling efficiency, MFU, loss",
    ),
    "sync": ("sync_cmd", "upload the offline Weights & Biases runs of run directories (wandb sync)"),
}

EXAMPLES = """examples:
  supertune train                                   # embedded default: tiny Llama, own corpus, CPU, ~1 minute
  supertune train run.yaml training.max_steps=500   # a config file with an override
  supertune train run.yaml --nproc 2                # two local processes under torchrun
  supertune eval runs/supertune-*/model --data valid.jsonl
  supertune generate runs/supertune-*/model --prompt "Once upon"
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="supertune",
        description="Fine-tune and pre-train Hugging Face causal language models, from one CPU to SLURM clusters.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"supertune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        command = importlib.import_module(f"{__package__}.{module}")
        p = sub.add_parser(
            name,
            help=summary,
            description=command.DESCRIPTION,
            epilog=command.epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`supertune config keys | head -1`): stop quietly, as a shell tool
        # does on SIGPIPE, and keep the interpreter's final flush from raising again.
        _quiet_stdout()
        return 141


def _quiet_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (captured output): nothing is flushed to a pipe at exit


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    # Overrides may come after options (`train --nproc 2 a=b`), which argparse's positional
    # handling rejects; collect those leftovers into the command's overrides.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    from ..errors import UserError

    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("supertune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
