"""`supertune average MODEL MODEL [MODEL ...] --out DIR [--weights ...] [--dtype ...]`"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Federated averaging (FedAvg): out = sum_i w_i * model_i with the weights normalised, each MODEL a run "
    "directory, a checkpoint (an FSDP run's sharded one too), a saved model or LoRA adapter directory. Weighted "
    "by tokens seen by default (from checkpoint manifests and run summaries). Streams a slice of a tensor at a "
    "time, so memory stays at a few slices whatever the model's size (an FSDP checkpoint: one whole tensor), "
    "and writes sharded safetensors with an index, the config, "
    "the tokenizer and a manifest (supertune-average.json). Refuses, writing nothing, models that differ in "
    "architecture, tensors or tokenizer, NaN or Inf values, and outputs inside an input. docs/federated/average.md."
)


def epilog() -> str:
    return (
        "examples:\n"
        "  supertune average runs/leonardo runs/karolina --out avg/round-1\n"
        "  supertune average site-a/checkpoints/checkpoint-800 site-b/model --out avg --weights uniform --dtype bf16\n"
        "  supertune average a/model b/model c/model --out avg --weights 0.5,0.3,0.2\n"
        "  supertune average lora-a/model lora-b/model --out merged --merge-first --base /models/llama\n"
        "  supertune average fed/round-003/global --out fed-merged --merge-first --base /models/llama   # one adapter\n"
        "  supertune average a b --out round-2 --global-model round-1 --server-lr 1.0 --server-momentum 0.9\n"
        "  supertune average a b --out round-2 --global-model round-1 --server-optimizer fedadam --server-lr 0.01\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..averaging.server_optimizers import DEFAULT_SERVER_OPTIMIZER, SERVER_OPTIMIZERS, server_optimizer_names

    p.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="run directories, checkpoints, or model/adapter directories (two or more)",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="new directory for the average (must not exist, or be empty)"
    )
    p.add_argument(
        "--weights",
        default="tokens",
        metavar="tokens|samples|uniform|W1,W2,...",
        help="tokens seen (default), samples seen, equal, or one number per input (normalised)",
    )
    p.add_argument(
        "--dtype",
        default="same",
        choices=["same", "bf16", "fp16", "fp32"],
        help="output dtype of averaged tensors (same: each keeps its own)",
    )
    p.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE", help="largest output shard, e.g. 5GB (default), 500MB"
    )
    p.add_argument(
        "--merge-first", action="store_true", help="LoRA adapters: merge each into --base and average the merged models"
    )
    p.add_argument("--base", metavar="DIR", help="with --merge-first: the base model the adapters were trained on")
    server = p.add_argument_group(
        "server step: d = average - g; fedavgm: v = momentum * v_prev + d, g_new = g + lr * v "
        "(the others in docs/federated/server-optimizers.md)"
    )
    server.add_argument("--global-model", metavar="DIR", help="the previous global model g the inputs started from")
    server.add_argument(
        "--server-optimizer",
        choices=server_optimizer_names(),
        help=f"how the averaged change d moves g (default {DEFAULT_SERVER_OPTIMIZER})",
    )
    server.add_argument(
        "--server-lr",
        type=float,
        metavar="LR",
        help=f"server learning rate (default: {', '.join(f'{o.name} {o.lr:g}' for o in SERVER_OPTIMIZERS.values())})",
    )
    server.add_argument(
        "--server-momentum",
        type=float,
        metavar="BETA",
        help="server momentum (beta1) in [0, 1), 0 keeps none "
        f"(default: {', '.join(f'{o.name} {o.momentum:g}' for o in SERVER_OPTIMIZERS.values())})",
    )
    server.add_argument(
        "--server-beta2",
        type=float,
        metavar="B2",
        help=f"{_reading('server_beta2')}: decay of the second moment (default 0.99)",
    )
    server.add_argument(
        "--server-tau",
        type=float,
        metavar="TAU",
        help=f"{_reading('server_tau')}: added to sqrt(second moment), which starts at tau^2 (default 1e-3)",
    )
    server.add_argument(
        "--momentum-in",
        metavar="FILE",
        help="previous momentum or first moment (default: server-momentum.safetensors in --global-model, else zero); "
        "the second moment is read beside it",
    )
    server.add_argument(
        "--momentum-out",
        metavar="FILE",
        help="where to write the new momentum (default: server-momentum.safetensors in --out)",
    )


def _reading(key: str) -> str:
    """The server optimizers whose step reads aggregation's `key`, from their records."""
    from ..averaging.server_optimizers import SERVER_OPTIMIZERS

    return ", ".join(o.name for o in SERVER_OPTIMIZERS.values() if key in o.uses)


def run(args: argparse.Namespace) -> int:
    from ..averaging import ServerStep, average_checkpoints
    from ..averaging.server_optimizers import DEFAULT_SERVER_OPTIMIZER
    from ..byte_sizes import parse_byte_size
    from ..errors import UserError

    if args.merge_first != (args.base is not None):
        raise UserError(
            "--merge-first and --base go together: --merge-first --base DIR merges LoRA adapters into DIR before averaging"
        )
    given = {
        "--server-optimizer": args.server_optimizer,
        "--server-lr": args.server_lr,
        "--server-momentum": args.server_momentum,
        "--server-beta2": args.server_beta2,
        "--server-tau": args.server_tau,
        "--momentum-in": args.momentum_in,
        "--momentum-out": args.momentum_out,
    }
    server_flags = [flag for flag, value in given.items() if value is not None]
    if server_flags and not args.global_model:
        raise UserError(
            f"{server_flags[0]} needs --global-model DIR, the previous global model the inputs started from"
        )
    try:
        max_shard = parse_byte_size(args.max_shard_size)
    except ValueError as exc:
        raise UserError(f"--max-shard-size: {exc}") from None
    server = None
    if args.global_model:
        server = ServerStep(
            global_model=args.global_model,
            lr=args.server_lr,
            momentum=args.server_momentum,
            momentum_in=args.momentum_in,
            momentum_out=args.momentum_out,
            optimizer=args.server_optimizer or DEFAULT_SERVER_OPTIMIZER,
            beta2=0.99 if args.server_beta2 is None else args.server_beta2,
            tau=1e-3 if args.server_tau is None else args.server_tau,
        )
    manifest = average_checkpoints(
        args.models,
        args.out,
        weights=args.weights,
        dtype=args.dtype,
        max_shard_bytes=max_shard,
        merge_base=args.base,
        server=server,
        report=lambda line: print(f"supertune: {line}", file=sys.stderr, flush=True),
        # one adapter merged into its base is a merge of its own (a LoRA federation's last global adapter)
        minimum_inputs=1 if args.merge_first else 2,
    )
    counts = f", {manifest.tokens:,} tokens" if manifest.tokens is not None else ""
    print(
        f"supertune: averaged {len(manifest.inputs)} {'adapters' if manifest.kind == 'adapter' else 'models'} ({manifest.weights}{counts}) "
        f"into {args.out}: {manifest.tensors} tensors, {manifest.parameters:,} parameters, {manifest.seconds:.1f} s"
    )
    return 0
