"""`supertune generate MODEL --prompt TEXT`"""

from __future__ import annotations

import argparse

from .model_verify_args import add_verify_arguments, verify_mode

DESCRIPTION = "Continue a prompt with a saved model and print the text."


def epilog() -> str:
    return (
        "examples:\n"
        '  supertune generate runs/supertune-20261121-101500/model --prompt "The river"\n'
        '  supertune generate ./my-model --prompt "Write a document:" --max-new-tokens 200 --greedy\n'
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model directory (Hugging Face format)")
    p.add_argument("--prompt", default="The", help="text to continue (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    add_verify_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..config import ConfigError, GenerateConfig, build_config
    from ..config.validate import validate_generate
    from ..evaluation.generate import generate_text
    from ..evaluation.perplexity import load_saved_model

    # Every value is checked before the model is loaded, each problem named by its option.
    flags = {
        "prompt": "--prompt",
        "max_new_tokens": "--max-new-tokens",
        "temperature": "--temperature",
        "top_k": "--top-k",
        "seed": "--seed",
    }
    try:
        g = build_config(
            GenerateConfig,
            {
                "prompt": args.prompt,
                "max_new_tokens": args.max_new_tokens,
                "do_sample": not args.greedy,
                "temperature": args.temperature,
                "top_k": args.top_k,
                "seed": args.seed,
            },
        )
        validate_generate(g)
        if g.max_new_tokens < 1:
            raise ConfigError([f"max_new_tokens: must be at least 1, got {g.max_new_tokens}"])
    except ConfigError as exc:
        raise ConfigError([_flag_named(p, flags) for p in exc.problems]) from None
    model, tokenizer = load_saved_model(args.model, verify_mode(args))
    print(generate_text(model, tokenizer, g))
    return 0


def _flag_named(problem: str, flags: dict[str, str]) -> str:
    """'generate.seed: ...' or 'seed: ...' -> '--seed: ...'."""
    key, sep, rest = problem.partition(":")
    name = flags.get(key.removeprefix("generate."))
    return f"{name}:{rest}" if sep and name else problem
