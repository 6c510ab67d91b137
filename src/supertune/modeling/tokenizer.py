"""Which tokenizer a run uses: a named one, a new one trained on the data, or the embedded default."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError, first_line
from ..hub import resolve_reference

__all__ = ["load_tokenizer", "token_id_limit", "tokenizer_problem", "tokenizer_source"]


def tokenizer_source(cfg: RunConfig) -> tuple[str, bool]:
    """(reference, local_files_only) of the tokenizer this config asks for, building it if needed."""
    m = cfg.model
    if m.bundle:
        from .bundle import bundle_tokenizer

        return bundle_tokenizer(m.bundle), True
    if m.tokenizer == "train":
        return str(_trained_on_data(cfg)), True
    if m.tokenizer:
        r = resolve_reference(m.tokenizer, "model.tokenizer", "tokenizer_config.json", m.revision)
        return r.ref, r.local_files_only
    if m.name_or_path:
        r = resolve_reference(m.name_or_path, "model.name_or_path", "config.json", m.revision)
        return r.ref, r.local_files_only
    from ..embedded import default_tokenizer

    return str(default_tokenizer()), True


def load_tokenizer(cfg: RunConfig) -> Any:
    """The fast tokenizer of the run, with a pad token (EOS stands in when the tokenizer has none)."""
    from transformers import AutoTokenizer

    ref, local_only = tokenizer_source(cfg)
    try:
        tok = AutoTokenizer.from_pretrained(
            ref, local_files_only=local_only, trust_remote_code=cfg.model.trust_remote_code, revision=cfg.model.revision
        )
    except (OSError, ValueError) as exc:
        field = (
            "model.bundle" if cfg.model.bundle else "model.tokenizer" if cfg.model.tokenizer else "model.name_or_path"
        )
        raise UserError(f"{field}: cannot load a tokenizer from {ref!r}: {first_line(exc)}") from None
    if not getattr(tok, "is_fast", False):
        raise UserError(f"model.tokenizer: {ref!r} has no fast (Rust) tokenizer; supertune needs tokenizer.json")
    if tok.eos_token_id is None:
        raise UserError(f"model.tokenizer: {ref!r} has no EOS token, which packing puts between documents")
    problem = tokenizer_problem(tok)
    if problem:
        field = (
            "model.bundle" if cfg.model.bundle else "model.tokenizer" if cfg.model.tokenizer else "model.name_or_path"
        )
        raise UserError(
            f"{field}: the tokenizer of {ref!r} {problem}; give a directory with the tokenizer the model was trained with (tokenizer.json)"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    m = cfg.model
    own = m.tokenizer == "train" or not (m.bundle or m.tokenizer or m.name_or_path)
    # Preference rows may be conversations: they get a template when one is at hand (a row that
    # needs one and finds none is refused with its number).
    preference = cfg.training.objective != "sft" and (
        own or cfg.data.chat_template or getattr(tok, "chat_template", None)
    )
    if cfg.data.format == "chat" or preference:
        from ..conversations.template import attach_chat_template

        attach_chat_template(cfg.data, tok, ref, own_tokenizer=own)
    return tok


def token_id_limit(tokenizer: Any) -> int:
    """One more than the largest id the tokenizer can produce (its added tokens included): its length,
    unless its vocabulary leaves gaps in the ids."""
    ids = tokenizer.get_vocab().values()
    return max(len(tokenizer), max(ids, default=-1) + 1)


def tokenizer_problem(tok: Any) -> str | None:
    """Why a loaded tokenizer cannot encode text (None: it can): a vocabulary of nothing but its
    special tokens, which transformers builds from a tokenizer_config.json without vocabulary files.

    Structural on purpose: probing with some text would refuse tokenizers of other scripts or of
    DNA; whether the run's own text encodes is checked on its first batch (data.sample_checks).
    """
    special = set(getattr(tok, "all_special_ids", []) or []) | set(getattr(tok, "added_tokens_encoder", {}).values())
    ordinary = [i for i in tok.get_vocab().values() if i not in special]
    if not ordinary:
        return f"has no vocabulary (only its {len(special)} special tokens): every document would encode into nothing but EOS"
    return None


def _trained_on_data(cfg: RunConfig) -> Path:
    """A byte-level BPE trained on the configured training documents, cached by their content hash."""
    from ..documents.encoding import iter_texts
    from ..documents.sources import load_raw_splits, training_files
    from ..embedded import cached_tokenizer

    d = cfg.data
    digest = hashlib.sha256()
    digest.update(f"{d.text_field}|{d.template}|{d.dataset_name}|{d.dataset_config}".encode())
    for path in training_files(d):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    key = "data-" + digest.hexdigest()[:16]

    def texts():
        return iter_texts(load_raw_splits(d, cfg.training.seed).train, d)

    return cached_tokenizer(key, texts, cfg.model.tokenizer_vocab_size)
