"""What `supertune average` refuses before it writes anything, each problem one line naming the input
and the way out: too few inputs, an output that is an input or inside one, mixed adapters and full
models, configs that shape tensors differently, different tensor names, shapes or dtypes, different
tokenizers (by content hash)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError
from ..output_dirs import check_output_dir
from .inputs import ADAPTER_CONFIG, MODEL_CONFIG, TOKENIZER_FILES, ModelInput

__all__ = [
    "check_inputs",
    "check_output_path",
    "check_same_tensors",
    "config_differences",
    "joined_problems",
    "tokenizer_sha256",
]

# Bookkeeping keys of config.json that may differ between copies of one model.
_IGNORED_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "use_cache", "_commit_hash"}
# Keys of config.json that decide tensor shapes or which tensors exist (the tensor check catches
# anything these miss, with a less telling message).
_SHAPING_KEY = re.compile(
    r"^(architectures|model_type|tie_word_embeddings|vocab_size|head_dim|hidden_size|intermediate_size)$"
    r"|^(num|n)_|(_size|_sizes|_dim|_dims|_layers?|_heads|_experts|_positions|_embeddings|_rank)$"
)
# adapter_config.json keys that decide the adapter tensors or what they mean once scaled.
_ADAPTER_KEYS = (
    "peft_type",
    "r",
    "lora_alpha",
    "target_modules",
    "use_rslora",
    "use_dora",
    "fan_in_fan_out",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "lora_bias",
    "bias",
)
# tokenizer_config.json keys that record where a tokenizer was loaded from, not what it does.
_TOKENIZER_BOOKKEEPING = {"name_or_path", "is_local", "local_files_only", "tokenizer_file", "_commit_hash"}
_SHOWN = 3


def joined_problems(problems: Sequence[str]) -> str:
    """One problem as its line; several as a count and one indented line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)


def check_output_path(
    out: Path,
    inputs: Sequence[ModelInput],
    others: Sequence[tuple[str, Path]] = (),
    flag: str = "--out",
    new_directory: bool = True,
) -> list[str]:
    """An output must neither be nor lie inside nor contain any input, and (new_directory) must be new or an empty directory.

    `others`: further paths the average reads (the --base model, the previous global model)."""
    problems = []
    given, out = out, Path(os.path.realpath(Path(out).expanduser()))  # symbolic links resolved on both sides
    read = [(f"MODEL {inp.arg}", Path(inp.arg).expanduser()) for inp in inputs]
    read += [(f"MODEL {inp.arg}", inp.directory) for inp in inputs] + [(name, Path(p)) for name, p in others]
    for name, path in ((n, Path(os.path.realpath(p))) for n, p in read):
        if out == path or path in out.parents:
            where = f"is {name} itself" if out == path else f"lies inside {name}"
            problems.append(f"{flag} {out} {where}; write to a new path outside every input")
            return problems
        if out in path.parents:
            problems.append(f"{flag} {out} contains {name}; write to a new path outside every input")
            return problems
    if new_directory:
        try:
            check_output_dir(given, flag, "average")
        except UserError as exc:
            problems.append(str(exc))
    return problems


def config_differences(inputs: Sequence[ModelInput]) -> tuple[dict[int, str], list[str]]:
    """({input index: problem}, notes) from comparing each input's config.json (or adapter_config.json) with the first's.

    Keys that shape tensors must agree; any other difference is a note (the output keeps the first
    input's values). One line per input either way."""
    problems: dict[int, str] = {}
    notes = []
    name = ADAPTER_CONFIG if inputs[0].adapter else MODEL_CONFIG
    reference = inputs[0].json_file(name)
    for i, inp in enumerate(inputs[1:], start=1):
        config = inp.json_file(name)
        if (config is None) != (reference is None):
            which = 0 if reference is None else i
            problems[i] = (
                f"{inputs[which].label(which)} has no {name}; every input needs one, to compare their architectures"
            )
            continue
        if config is None:
            continue
        flat_ref, flat = _flatten(reference), _flatten(config)
        shaping, other = [], []
        for key in sorted(set(flat_ref) | set(flat)):
            a, b = flat_ref.get(key), flat.get(key)
            if a == b or key.split(".")[-1] in _IGNORED_CONFIG_KEYS:
                continue
            if key == "target_modules" and isinstance(a, list) and isinstance(b, list) and sorted(a) == sorted(b):
                continue
            if key in _ADAPTER_KEYS if name == ADAPTER_CONFIG else _SHAPING_KEY.search(key.split(".")[-1]):
                shaping.append(f"{key} {b!r} (input 1: {a!r})")
            elif name == MODEL_CONFIG or key == "base_model_name_or_path":
                other.append(key)
        if shaping:
            problems[i] = (
                f"{inp.label(i)}: {name} differs from input 1's in {_few(shaping)}; only models of one architecture and size can be averaged"
            )
        elif other:
            notes.append(
                f"{inp.label(i)}: {name} differs from input 1's in {_few(other)}, which shape no tensor; the output keeps input 1's"
            )
    return problems, notes


def check_same_tensors(reference: ModelInput, ref_index: int, other: ModelInput, index: int) -> str | None:
    """What is wrong with `other`'s tensors against `reference`'s, in one line: names first, then shapes and dtypes."""
    a, b = reference.weights.where, other.weights.where
    label, ref_label = other.label(index), reference.label(ref_index)
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks {len(missing)} tensor(s) of {ref_label} ({_few(missing)})")
        if extra:
            parts.append(f"has {len(extra)} tensor(s) {ref_label} lacks ({_few(extra)})")
        return f"{label} " + " and ".join(parts) + "; only models with the same tensors can be averaged"
    differ = [
        n for n in reference.weights.in_file_order() if (a[n][1].shape, a[n][1].dtype) != (b[n][1].shape, b[n][1].dtype)
    ]
    if not differ:
        return None
    ea, eb = a[differ[0]][1], b[differ[0]][1]
    dtype_only = all(a[n][1].shape == b[n][1].shape for n in differ)
    return (
        f"{label}: {len(differ)} tensor(s) differ in {'dtype' if dtype_only else 'shape or dtype'} from {ref_label}'s, "
        f"e.g. {differ[0]} is {eb.dtype} {list(eb.shape)} against {ea.dtype} {list(ea.shape)}; "
        + (
            "convert one model to the other's dtype first"
            if dtype_only
            else "only models with the same tensor shapes can be averaged"
        )
    )


def tokenizer_sha256(inp: ModelInput) -> str | None:
    """sha256 over the tokenizer files beside the weights (bookkeeping keys of tokenizer_config.json left
    out), or None when there is no tokenizer."""
    present = [name for name in TOKENIZER_FILES if name in inp.side_files]
    if not present:
        return None
    digest = hashlib.sha256()
    for name in present:
        data = (inp.directory / name).read_bytes()
        if name == "tokenizer_config.json":
            try:
                config = json.loads(data)
                data = json.dumps(
                    {k: v for k, v in config.items() if k not in _TOKENIZER_BOOKKEEPING}, sort_keys=True
                ).encode()
            except ValueError:
                pass
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def check_inputs(
    inputs: Sequence[ModelInput], out: Path, others: Sequence[tuple[str, Path]] = (), minimum: int = 2
) -> tuple[list[str], str | None]:
    """Everything refused before writing; (notes, the common tokenizer's sha256). Raises one UserError listing every problem.

    minimum: 2 for a user's average; a federation's round takes 1 (the one site left after the others
    were dropped: its "average" is its own model, through the same checks, writer and server step)."""
    if len(inputs) < minimum:
        raise UserError(f"supertune average needs at least two models, got {len(inputs)}; name every model to average")
    problems = check_output_path(out, inputs, others)
    kinds = {inp.adapter for inp in inputs}
    if len(kinds) > 1:
        adapters = [inp.label(i) for i, inp in enumerate(inputs) if inp.adapter]
        problems.append(
            f"{', '.join(adapters)} hold LoRA adapters and the others full models; average adapters with adapters (or merge them first)"
        )
        raise UserError(joined_problems(problems))
    config_problems, notes = config_differences(inputs)
    problems += list(config_problems.values())
    for i, inp in enumerate(inputs[1:], start=1):
        tensor_problem = None if i in config_problems else check_same_tensors(inputs[0], 0, inp, i)
        if tensor_problem:
            problems.append(tensor_problem)
    digests = [tokenizer_sha256(inp) for inp in inputs]
    known = [(i, d) for i, d in enumerate(digests) if d is not None]
    for i, d in known[1:]:
        if d != known[0][1]:
            first = known[0][0]
            problems.append(
                f"{inputs[i].label(i)} has a different tokenizer from {inputs[first].label(first)} (content sha256 {d[:12]}... vs {known[0][1][:12]}...); "
                "models trained with different tokenizers cannot be averaged"
            )
    if problems:
        raise UserError(joined_problems(problems))
    if known and len(known) < len(inputs):
        missing = [inputs[i].label(i) for i, d in enumerate(digests) if d is None]
        notes.append(
            f"{', '.join(missing)} hold no tokenizer; the output gets {inputs[known[0][0]].label(known[0][0])}'s"
        )
    return notes, (known[0][1] if known else None)


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict) and key not in ("rank_pattern", "alpha_pattern"):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _few(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
