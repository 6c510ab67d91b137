"""LoRA federations: sites train low-rank adapters on a frozen base, and only adapters move.

aggregation.lora decides what the round's global model is:

- adapters: the global adapter, the weighted average of the sites' A and B tensors (FedAvg of the
  adapter tensors). Every site continues training it from the next round on, on the same frozen
  base. Round 1 starts from one initial adapter made here (peft's initialisation, seeded with the
  federation's seed), so that every site's A starts equal: averaging the A of adapters that were
  initialised apart averages unrelated bases of the low-rank space. After the last round the global
  adapter is merged into the base (`FederationDir.merged`).
- merged: the global model is the previous one plus the weighted average of the sites' products
  s * B_i @ A_i (the average of the merged models, `supertune average --merge-first`), a full model.
  Every site starts a fresh adapter on it next round: the previous adapters are inside its weights.

The two differ because the average of products is not the product of averages: sum_i w_i B_i A_i
!= (sum_i w_i B_i)(sum_i w_i A_i). adapters moves only adapter bytes both ways; merged moves adapter
bytes up and the full model down to every site.

Which mode a federation's sites are in, and what is refused, is config/lora_modes.py's; the bytes
of a model or an adapter, state/model_files.py's.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from ...config.schema import RunConfig
from ..config.schema import FederationConfig
from ..state.layout import FederationDir

__all__ = ["initial_adapter", "merge_final_adapter"]


def initial_adapter(fed: FederationConfig, cfg: RunConfig, base: Path, root: FederationDir) -> Path:
    """Round 1's global adapter (aggregation.lora: adapters): peft's initial adapter on the base, made
    once with the federation's seed and saved with the tokenizer; B is zero, so it is the base exactly."""
    target = root.round(0).path / "adapter"
    if target.is_dir():
        return target
    from transformers import set_seed

    from ...modeling.model import build_model
    from ...modeling.tokenizer import load_tokenizer

    model_cfg = replace(cfg.model, name_or_path=str(base.absolute()), from_config=False, config_overrides={})
    tokenizer = load_tokenizer(replace(cfg, model=model_cfg))
    set_seed(fed.seed)
    model = build_model(replace(model_cfg, gradient_checkpointing=False), tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".adapter.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # published complete, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def merge_final_adapter(fed: FederationConfig, base: Path, root: FederationDir) -> Path | None:
    """The last round's global adapter merged into the base: a full model that loads without peft
    (`FederationDir.merged`); None before the last round is averaged. Made once, published by a rename."""
    from ...averaging import average_checkpoints
    from ..state.receipts import read_receipt

    last = root.round(fed.rounds)
    if read_receipt(last.averaged) is None:
        return None
    if not root.merged.is_dir():
        average_checkpoints([last.global_model], root.merged, weights="uniform", merge_base=base, minimum_inputs=1)
    return root.merged
