"""Cheap checks of a local model directory before anything is loaded: its config.json, the headers
of its weight files, its manifest's sizes, and whether it holds a tokenizer at all.

Pure Python (json, struct, zipfile): config validation runs them in every command that creates a
run, on a login node too, and they read a few KB per file whatever the model's size;
`check_saved_model`, run where a model is loaded, adds its manifest's sha256 (reading every file). What they
catch would otherwise surface as a safetensors or torch traceback after a run directory exists, or
as no error at all: transformers builds an empty tokenizer for a directory whose tokenizer_config.json
names a class but that holds no vocabulary, and every document then becomes a lone EOS token.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from ..errors import UserError, first_line

__all__ = [
    "NO_TOKENIZER",
    "check_saved_model",
    "TOKENIZER_VOCAB_FILES",
    "has_tokenizer_files",
    "model_config_problems",
    "model_dir_problems",
    "safetensors_problem",
]

TOKENIZER_VOCAB_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "tiktoken.model",
)
"""Files that hold a tokenizer's vocabulary; tokenizer_config.json alone holds none."""
NO_TOKENIZER = (
    f"holds no tokenizer ({', '.join(TOKENIZER_VOCAB_FILES[:3])}, ...), and one built from it would encode every "
    "document as nothing"
)

# Sizes of a model config that must be positive integers when present (GPT-2, Llama, OPT, T5 names).
_POSITIVE = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "head_dim", "n_layer", "n_head", "n_embd", "n_positions", "n_inner", "n_ctx",
    "d_model", "num_layers", "num_heads", "ffn_dim", "d_ff",
)  # fmt: skip
_HEADER_LIMIT = 100 << 20  # safetensors refuses headers above 100 MB itself


def has_tokenizer_files(directory: str | Path) -> bool:
    """Whether the directory holds a tokenizer vocabulary (not just tokenizer_config.json)."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_VOCAB_FILES)


def model_config_problems(values: dict[str, Any]) -> list[str]:
    """What is wrong with a model config's sizes (plain data: config.json or a config's to_dict()), one line each."""
    problems = []
    for key in _POSITIVE:
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            problems.append(f"{key} is {value!r}; it must be a positive integer")
        elif value >= 2**31:
            problems.append(f"{key} is {value}, beyond what any model has (token ids and sizes are 32-bit)")
    hidden, heads, kv = values.get("hidden_size"), values.get("num_attention_heads"), values.get("num_key_value_heads")
    if (
        not problems
        and isinstance(hidden, int)
        and isinstance(heads, int)
        and values.get("head_dim") is None
        and hidden % heads
    ):
        problems.append(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if not problems and isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        problems.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return problems


def model_dir_problems(directory: str | Path, weights: bool = True) -> list[str]:
    """What is wrong with a saved model directory's files, without loading it; each line names the file.

    weights: check the weight files too (not when only the config is used, model.from_config).
    Whether it holds a tokenizer is `has_tokenizer_files`.
    """
    root = Path(directory)
    problems = []
    config = root / "config.json"
    if config.is_file():
        try:
            values = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            values = None
            problems.append(f"config.json is not readable JSON ({first_line(exc)})")
        if values is not None and not isinstance(values, dict):
            problems.append("config.json is not a JSON object")
        elif values is not None:
            problems += [f"config.json: {p}" for p in model_config_problems(values)]
    if weights:
        problems += _weight_problems(root)
    return problems


def _weight_problems(root: Path) -> list[str]:
    from .manifest import model_manifest_size_problems

    problems = model_manifest_size_problems(root)
    if problems:
        return problems  # truncated or missing files: the headers below would say the same less clearly
    shards = sorted(root.glob("*.safetensors"))
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            named = sorted({str(v) for v in weight_map.values()})
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            return [f"{index.name} is not a readable safetensors index"]
        problems += [f"{name}: named by {index.name} but missing" for name in named if not (root / name).is_file()]
    for path in shards:
        problem = safetensors_problem(path)
        if problem:
            problems.append(f"{path.name}: {problem}")
    for path in sorted(root.glob("*.bin")):
        if path.name.startswith("pytorch_model") and not _zip_sound(path):
            problems.append(f"{path.name}: not a complete torch archive (truncated or damaged)")
    return problems


def safetensors_problem(path: str | Path) -> str | None:
    """Why a .safetensors file cannot be read (empty, truncated, not safetensors), from its header alone; None when sound.

    The layout: 8 bytes of header length (little-endian), a JSON header naming each tensor's byte
    range, then the data; the last range must end exactly at the end of the file.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, too short for a safetensors file (empty or truncated)"
            (length,) = struct.unpack("<Q", head)
            if length > min(_HEADER_LIMIT, size - 8):
                return "not a safetensors file (its header length is beyond the file): damaged, or another format"
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    except (UnicodeDecodeError, ValueError):
        return "not a safetensors file (its header is not JSON): damaged, or another format"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a JSON object)"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "its header has no valid tensor offsets: damaged"
    if 8 + length + end != size:
        return f"{size} bytes where its header describes {8 + length + end}: truncated or damaged"
    return None


def _zip_sound(path: Path) -> bool:
    """torch.save writes a zip archive (its central directory is at the end: a truncated file has none);
    a file in the legacy pickle format is left to torch."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return True
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


# Model directories whose manifest was verified in this process, by (path, manifest mtime): a local
# `supertune train` verifies before creating the run directory and would otherwise hash again when
# the model is loaded.
_VERIFIED: set[tuple[str, int]] = set()


def check_saved_model(directory: str, label: str, verify: str, tokenizer: bool) -> str:
    """Refuse a local model directory whose files are damaged, before loading it: config.json, the
    weight files' headers, and its manifest (sizes, and sha256 by `verify`: see
    supertune.checkpoints.manifest.VERIFY_MODES); returns what was verified, for the log. A hub id
    or a cache entry is left to its loader. Every process that loads the model checks it: sha256
    costs about 1 s per GB and core, read from the page cache after the first process."""
    from .manifest import verify_model_files

    if not os.path.isdir(directory):
        return "not a local directory"
    problems, skip, verified = model_dir_problems(directory, weights=True), "", "not verified"
    if not problems:
        stamp = _manifest_stamp(directory)
        if stamp in _VERIFIED and verify != "none":
            verified = "verified before in this process"
        else:
            problems, verified = verify_model_files(Path(directory), verify)
            skip = "" if label == "model.name_or_path" else " (--no-verify loads it unchecked)"
            if not problems and stamp is not None and verify in ("auto", "sha256"):
                _VERIFIED.add(stamp)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{label}: {directory!r} is damaged: {problems[0]}{more}; save or copy the model again{skip}")
    if tokenizer and not has_tokenizer_files(directory):
        raise UserError(
            f"{label}: {directory!r} {NO_TOKENIZER}; save the model with its tokenizer (tokenizer.save_pretrained)"
        )
    return verified


def _manifest_stamp(directory: str) -> tuple[str, int] | None:
    """The directory and the time of the manifest it is verified against (whichever it has), or None."""
    from .manifest import MODEL_MANIFEST_NAMES

    for name in MODEL_MANIFEST_NAMES:
        try:
            return os.path.realpath(directory), os.stat(Path(directory) / name).st_mtime_ns
        except OSError:
            continue
    return None
