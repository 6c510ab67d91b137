"""Everything the arms share, made once before any clock starts: text files, tokenizer, model config.

The work directory keeps the tokenizer and model config between benchmark runs (keyed by the
text's hash), so only the first run pays for training the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .settings import BenchSettings

__all__ = ["Prepared", "prepare"]

# Lines of valid.txt given to supertune as its validation file. supertune always evaluates after
# training; a small file keeps that short. The loss is not part of the benchmark, so the overlap
# with the training text does not matter.
HELDOUT_LINES = 100


@dataclass(frozen=True)
class Prepared:
    """Paths the arms read."""

    train_txt: Path
    """valid.txt + test.txt, verbatim: one paragraph or heading per line, empty lines included."""
    heldout_txt: Path
    tokenizer_dir: Path
    model_config_dir: Path
    training_args_json: Path
    text_sha256: str
    num_lines: int
    num_documents: int
    """Lines with non-blank text: what supertune and the padded recipe train on."""


def prepare(data_dir: Path, work_dir: Path, settings: BenchSettings) -> Prepared:
    """Write the shared inputs under work_dir; reuse the tokenizer when the text has not changed."""
    sources = [data_dir / "valid.txt", data_dir / "test.txt"]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise SystemExit(
            f"train_throughput: missing {', '.join(missing)}; pass --data-dir with wikitext-2's valid.txt and test.txt"
        )
    data = work_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    text = "".join(p.read_text(encoding="utf-8") for p in sources)
    if not text.endswith("\n"):
        text += "\n"
    train_txt = data / "train.txt"
    train_txt.write_text(text, encoding="utf-8")
    lines = text.splitlines()
    heldout_txt = data / "heldout.txt"
    heldout_txt.write_text("\n".join(lines[:HELDOUT_LINES]) + "\n", encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    documents = [line for line in lines if line.strip()]

    tokenizer_dir = work_dir / f"tokenizer-{digest[:12]}-v{settings.tokenizer_vocab_size}"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        from supertune.embedded import train_tokenizer

        # The same byte-level BPE trainer `model.tokenizer: train` uses, on the same documents.
        train_tokenizer(documents, tokenizer_dir, vocab_size=settings.tokenizer_vocab_size)

    model_config_dir = work_dir / "model-config"
    _write_model_config(tokenizer_dir, model_config_dir)
    training_args_json = work_dir / "training_args.json"
    training_args_json.write_text(json.dumps(settings.training_arguments(), indent=2) + "\n", encoding="utf-8")
    return Prepared(
        train_txt=train_txt,
        heldout_txt=heldout_txt,
        tokenizer_dir=tokenizer_dir,
        model_config_dir=model_config_dir,
        training_args_json=training_args_json,
        text_sha256=digest,
        num_lines=len(lines),
        num_documents=len(documents),
    )


def _write_model_config(tokenizer_dir: Path, out_dir: Path) -> None:
    """supertune's embedded tiny Llama config, sized to the shared tokenizer, as a config.json the baselines load.

    supertune builds the identical config itself from the same function when model.name_or_path
    is empty, so every arm starts from the same architecture (and, with the same seed, the same weights).
    """
    from transformers import AutoTokenizer, LlamaConfig

    from supertune.embedded.model import default_model_config

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    kwargs = default_model_config(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    LlamaConfig(**kwargs).save_pretrained(str(out_dir))
