"""`supertune generate MODEL --prompt TEXT` / `supertune generate MODEL --chat [--system TEXT] [--prompt TEXT]`"""

from __future__ import annotations

import argparse

from .model_verify_args import add_verify_arguments, verify_mode

DESCRIPTION = (
    "Continue a prompt with a saved model and print the text; with --chat, answer as the assistant, the "
    "conversation rendered with the model's chat template (the one its training saved): the answer to --prompt, "
    "or, without --prompt, to every line read from standard input, one conversation turn after another."
)


def epilog() -> str:
    return (
        "examples:\n"
        '  supertune generate runs/supertune-20261121-101500/model --prompt "The river"\n'
        '  supertune generate ./my-model --prompt "Write a document:" --max-new-tokens 200 --greedy\n'
        '  supertune generate runs/chat-run/model --chat --prompt "Where is the mill?"\n'
        '  supertune generate runs/chat-run/model --chat --system "Answer briefly."     # then type a question per line\n'
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model directory (Hugging Face format)")
    p.add_argument(
        "--prompt",
        help="text to continue (default: 'The'); with --chat, the user's turn (default: read turns from standard input)",
    )
    p.add_argument("--chat", action="store_true", help="answer as the assistant, with the model's chat template")
    p.add_argument("--system", help="with --chat: the system turn that opens the conversation")
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
    if args.system is not None and not args.chat:
        raise ConfigError(["--system: a system turn needs --chat; add --chat or remove --system"])
    try:
        g = build_config(
            GenerateConfig,
            {
                "prompt": "The" if args.prompt is None else args.prompt,
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
    if args.chat:
        return _chat(model, tokenizer, g, args)
    print(generate_text(model, tokenizer, g))
    return 0


def _chat(model, tokenizer, g, args: argparse.Namespace) -> int:
    """One answer to --prompt, or a conversation with standard input: a line is a user turn, the answer is
    printed and kept, so the next line continues the same conversation."""
    import sys

    from ..errors import UserError
    from ..evaluation.generate import generate_reply

    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"--chat: the tokenizer of {args.model!r} has no chat template; train with data.format=chat, "
            "which saves it, or generate without --chat"
        )
    messages = [{"role": "system", "content": args.system}] if args.system is not None else []
    turns = [args.prompt] if args.prompt is not None else (line.rstrip("\n") for line in sys.stdin)
    for turn in turns:
        if not turn.strip():
            continue
        messages.append({"role": "user", "content": turn})
        answer = generate_reply(model, tokenizer, g, messages)
        messages.append({"role": "assistant", "content": answer})
        print(answer, flush=True)
    return 0


def _flag_named(problem: str, flags: dict[str, str]) -> str:
    """'generate.seed: ...' or 'seed: ...' -> '--seed: ...'."""
    key, sep, rest = problem.partition(":")
    name = flags.get(key.removeprefix("generate."))
    return f"{name}:{rest}" if sep and name else problem
