"""The model every site starts round 1 from: the configured base, or the embedded tiny Llama built
once with fresh weights and saved (with its tokenizer) as round 0's global model.

The embedded tokenizer is saved with the embedded chat template (supertune.embedded.chat), as a chat
run's final model saves it: a site whose data.format is chat trains and is evaluated from the base
with the template its run would pick; a text site never reads it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..config.schema import FederationConfig
from ..state.layout import FederationDir

__all__ = ["base_model_dir"]


def base_model_dir(fed: FederationConfig, root: FederationDir) -> Path:
    """The base model's directory, building it first when the federation starts from fresh weights."""
    if fed.base_model:
        return Path(fed.base_model)
    target = root.round(0).global_model
    if not target.is_dir():
        _build(fed, target)
    return target


def _build(fed: FederationConfig, target: Path) -> None:
    """Build, save and rename into place: a killed build leaves no directory that looks complete."""
    from transformers import set_seed

    from ...config.schema import ModelConfig, RunConfig
    from ...embedded import EMBEDDED_CHAT_TEMPLATE
    from ...modeling.model import build_model
    from ...modeling.tokenizer import load_tokenizer

    set_seed(fed.seed)
    tokenizer = load_tokenizer(RunConfig())
    tokenizer.chat_template = EMBEDDED_CHAT_TEMPLATE
    model = build_model(ModelConfig(config_overrides=dict(fed.base_config_overrides)), tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".global.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
