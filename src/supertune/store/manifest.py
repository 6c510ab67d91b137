"""manifest.json of a token store: what was tokenized, how, and every file with its size and sha256.

The manifest holds no timestamps and no absolute paths, so two runs of `supertune prepare` on the
same inputs write byte-identical stores, and a store copied to another machine stays valid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..file_table import FileEntry

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "Manifest",
    "ShardEntry",
    "SourceFile",
    "SplitEntry",
    "TokenizerEntry",
    "read_manifest",
    "stored_rows",
    "tokenizer_fingerprint",
    "write_manifest",
]

FORMAT = "supertune-token-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "validation")


@dataclass
class ShardEntry(FileEntry):
    tokens: int = 0
    """Token ids in this shard (size / bytes per id)."""


@dataclass
class SplitEntry:
    """One split: its token stream cut into shards, and where each document starts in that stream."""

    documents: int
    tokens: int
    offsets: FileEntry
    """Little-endian int64, documents + 1 entries: document i is tokens [offsets[i], offsets[i+1]) of the split."""
    shards: list[ShardEntry] = field(default_factory=list)
    masks: list[ShardEntry] = field(default_factory=list)
    """The loss mask (data.loss_on) of conversations and prompt/completion rows: one byte per token, 1 where
    the token is trained, in shards of the same tokens as `shards`; empty for plain documents."""


@dataclass
class SourceFile:
    """A raw input file, by base name (its directory differs from machine to machine)."""

    name: str
    size: int
    sha256: str


@dataclass
class TokenizerEntry:
    sha256: str
    """sha256 of the tokenizer's tokenizer.json as canonical JSON (see tokenizer_fingerprint)."""
    vocab_size: int
    eos_token_id: int
    name: str
    """Base name of the tokenizer directory or hub id, for people; not checked."""


@dataclass
class Manifest:
    format: str
    version: int
    tokenizer: TokenizerEntry
    template: str | None
    text_field: str
    add_eos: bool
    split_rule: dict[str, Any]
    """How validation was chosen: {"validation": "files"} or {"validation": "percentage", "percentage": P, "seed": S}, plus sample limits."""
    sources: dict[str, list[SourceFile]]
    dtype: str
    """"uint16" or "uint32", little-endian."""
    splits: dict[str, SplitEntry]
    unigram_perplexity: float
    """Add-one unigram model of the train tokens on the validation tokens (the run summary's baseline)."""
    dataset: dict[str, str | None] | None = None
    """{"name": ..., "config": ...} of the hub dataset the documents came from; None for files."""
    bundle: list[FileEntry] | None = None
    """The offline bundle (`prepare --bundle`): tokenizer files under bundle/tokenizer/, model config under bundle/model/."""
    rows: dict[str, Any] | None = None
    """How conversations or prompt/completion rows were encoded (data.format, data.loss_on, their columns, the
    chat template's sha256), which the run must share; None for plain documents (and stores made before)."""

    def files(self) -> list[tuple[FileEntry, int]]:
        """Every file but the manifest, with the bytes per element it holds."""
        width = 2 if self.dtype == "uint16" else 4
        out: list[tuple[FileEntry, int]] = []
        for s in self.splits.values():
            out.append((s.offsets, 8))
            out += [(sh, width) for sh in s.shards]
            out += [(m, 1) for m in s.masks]
        out += [(f, 1) for f in self.bundle or []]
        return out


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the fast tokenizer's tokenizer.json, as canonical JSON.

    Canonical (sorted keys, no whitespace, truncation and padding cleared) because the same
    tokenizer is written with different indentation by different library versions, and
    transformers changes truncation/padding on the live object per call; none of that changes ids.
    Costs one JSON round trip of the tokenizer (tens of ms for a 150k vocabulary).
    """
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    data["truncation"] = None
    data["padding"] = None
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def stored_rows(d: Any, tokenizer: Any) -> dict[str, Any] | None:
    """The manifest's record of how conversations or prompt/completion rows became ids and masks (None
    for plain documents): a run from the store must encode its rows the same way."""
    if d.format == "text":
        return None
    if d.format == "chat":
        template = getattr(tokenizer, "chat_template", None) or ""
        return {
            "format": "chat",
            "loss_on": d.loss_target,
            "messages_field": d.messages_field,
            "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        }
    record = {
        "format": d.format,
        "loss_on": d.loss_target,
        "prompt_field": d.prompt_field,
        "completion_field": d.completion_field,
    }
    # Only when set: stores written before the templates existed keep matching the runs they made.
    for key in ("prompt_template", "completion_template"):
        if getattr(d, key) is not None:
            record[key] = getattr(d, key)
    return record


def write_manifest(directory: Path, manifest: Manifest) -> None:
    text = json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n"
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a store, or a UserError naming what is wrong with it."""
    path = directory / MANIFEST
    if not path.is_file():
        raise UserError(
            f"data.store: {str(directory)!r} is not a token store (no {MANIFEST}); make one with supertune prepare CONFIG --out DIR"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"data.store: cannot read {path}: {exc}; run supertune prepare again") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UserError(f"data.store: {path} is not a supertune token store manifest; run supertune prepare again")
    if raw.get("version") != FORMAT_VERSION:
        raise UserError(
            f"data.store: {path} has format version {raw.get('version')}, this supertune reads {FORMAT_VERSION}; "
            "run supertune prepare again with this version"
        )
    try:
        return _from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"data.store: {path} is incomplete or malformed ({type(exc).__name__}: {exc}); run supertune prepare again"
        ) from None


def _from_dict(raw: dict[str, Any]) -> Manifest:
    splits = {}
    for name in SPLITS:
        s = raw["splits"][name]
        splits[name] = SplitEntry(
            documents=int(s["documents"]),
            tokens=int(s["tokens"]),
            offsets=FileEntry(**s["offsets"]),
            shards=[ShardEntry(**sh) for sh in s["shards"]],
            masks=[ShardEntry(**m) for m in s.get("masks", [])],
        )
    if raw["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"dtype {raw['dtype']!r}")
    return Manifest(
        format=raw["format"],
        version=int(raw["version"]),
        tokenizer=TokenizerEntry(**raw["tokenizer"]),
        template=raw["template"],
        text_field=raw["text_field"],
        add_eos=bool(raw["add_eos"]),
        split_rule=dict(raw["split_rule"]),
        sources={k: [SourceFile(**f) for f in v] for k, v in raw["sources"].items()},
        dtype=raw["dtype"],
        splits=splits,
        unigram_perplexity=float(raw["unigram_perplexity"]),
        dataset=raw.get("dataset"),
        bundle=[FileEntry(**f) for f in raw["bundle"]] if raw.get("bundle") is not None else None,
        rows=raw.get("rows"),
    )
