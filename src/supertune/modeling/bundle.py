"""The offline bundle of a store: the run's tokenizer and model config, so that compute nodes without
hub access need nothing but the store (`supertune prepare --bundle`, read with model.bundle=DIR).

bundle/tokenizer/ is what the tokenizer's save_pretrained writes; bundle/model/config.json is the
config of model.name_or_path (only when one is named: the embedded tiny Llama is built from the
tokenizer alone). Both are listed in the manifest with size and sha256 like every shard, so a
damaged bundle is refused like a damaged shard. A few hundred kB to a few MB: no reason to leave it out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.schema import RunConfig
from ..errors import UserError, first_line
from ..file_table import FileEntry

__all__ = ["BUNDLE", "bundle_problem", "bundle_tokenizer", "bundle_model_config", "write_bundle"]

BUNDLE = "bundle"
TOKENIZER_DIR = f"{BUNDLE}/tokenizer"
MODEL_DIR = f"{BUNDLE}/model"


def write_bundle(directory: Path, cfg: RunConfig, tokenizer: Any) -> list[FileEntry]:
    """Save the tokenizer and (when the run names a model) its config under directory/bundle; returns their entries."""
    tokenizer.save_pretrained(directory / TOKENIZER_DIR)
    m = cfg.model
    if m.name_or_path is not None:
        from transformers import AutoConfig

        from ..hub import resolve_reference

        r = resolve_reference(m.name_or_path, "model.name_or_path", "config.json", m.revision)
        try:
            config = AutoConfig.from_pretrained(
                r.ref, local_files_only=r.local_files_only, revision=m.revision, trust_remote_code=m.trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise UserError(
                f"model.name_or_path: cannot read the config of {r.ref!r} for the bundle: {first_line(exc)}"
            ) from None
        config.save_pretrained(directory / MODEL_DIR)
    files = sorted(p for p in (directory / BUNDLE).rglob("*") if p.is_file())
    return [FileEntry.of(directory, p) for p in files]


def bundle_problem(store: str, model_config: bool) -> str | None:
    """What the bundle of the store at `store` lacks for a run (its tokenizer; with `model_config`,
    the model config too), or None. Checked when the run config is validated."""
    root = Path(store).expanduser()
    try:
        has_tokenizer = (root / TOKENIZER_DIR / "tokenizer_config.json").is_file()
        has_config = (root / MODEL_DIR / "config.json").is_file()
    except OSError as exc:  # a name too long for the file system, a path it refuses to stat
        return f"model.bundle: {store!r} cannot be read ({exc.strerror}); name the directory of a store made by supertune prepare --bundle"
    if not has_tokenizer:
        return f"model.bundle: {store!r} has no offline bundle (no {TOKENIZER_DIR}/); make the store with supertune prepare --bundle"
    if model_config and not has_config:
        return (
            f"model.bundle: the bundle of {store!r} holds no model config (its prepare named no model.name_or_path); "
            "run supertune prepare --bundle with model.name_or_path set, or set model.from_config=false"
        )
    return None


def bundle_tokenizer(store: str) -> str:
    """The bundle's tokenizer directory (present: see bundle_problem)."""
    return str(Path(store).expanduser() / TOKENIZER_DIR)


def bundle_model_config(store: str) -> str:
    """The bundle's model directory, config.json only (present: see bundle_problem)."""
    return str(Path(store).expanduser() / MODEL_DIR)
