"""The preference metrics of a saved model on held-out rows: `supertune eval` with training.objective
dpo, orpo, simpo or kto (that of the model's run, or asked for).

The numbers are those of the run's final evaluation for the same model and rows: the rows are read,
encoded and batched as the run does (supertune.training_data.preference_data), each batch is scored
by the run's own code (supertune.train.preference.preference_scoring), and the batches' losses are
weighed by their sequences, as the Trainer's evaluation loop weighs them. The reference of DPO and
KTO is the start model, built as the run built it (model.name_or_path, or fresh weights from
training.seed), its log-probabilities computed once before scoring
(supertune.train.preference.preference_reference); for a LoRA run, with the adapter switched off, which
is the base its training took as the reference. ORPO and SimPO have none.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from ...config.schema import RunConfig, TrainingConfig
from ...evaluation.perplexity import load_saved_model
from ...evaluation.placement import input_device
from ...modeling.model import build_model, context_length
from ...training_data.preference_batches import sequence_count
from ...training_data.preference_data import PreferenceRows, build_preference_data
from .preference_reference import attach_reference, scored_batches
from .preference_scoring import MetricSums, PreferenceScorer, reference_kind

__all__ = ["evaluate_preference_model", "preference_metrics"]


def evaluate_preference_model(model_dir: str, cfg: RunConfig, verify: str = "auto") -> dict[str, Any]:
    """eval_loss (the objective's), eval_rewards/accuracies, eval_rewards/margins and the other
    eval_* metrics of training.objective under TRL's names, and rows (pairs, or KTO's unpaired
    rows), on the validation split of cfg.data."""
    tokenizer_ref = cfg.model.tokenizer if cfg.model.tokenizer not in (None, "train") else None
    model, tokenizer = load_saved_model(model_dir, verify, tokenizer_ref)
    if cfg.data.chat_template or getattr(tokenizer, "chat_template", None):  # as the run's tokenizer got it
        from ...conversations.template import attach_chat_template

        attach_chat_template(cfg.data, tokenizer, tokenizer_ref or model_dir, own_tokenizer=False)
    t = cfg.training
    data = build_preference_data(cfg.data, t.objective, tokenizer, t.seed, context_length(model))
    rows = data.validation
    device = input_device(model)
    if reference_kind(t.objective, lora=False) is not None:
        start = _start_model(cfg, tokenizer).to(device)
        off = start.disable_adapter() if hasattr(start, "disable_adapter") else nullcontext()
        with off:
            attach_reference(start, [rows], data.collator.padded(), t.per_device_eval_batch_size, device)
        del start
    metrics = preference_metrics(model, rows, data.collator, t, t.per_device_eval_batch_size)
    metrics["rows"] = len(rows)
    return metrics


def preference_metrics(
    model: Any, rows: PreferenceRows, collator: Any, t: TrainingConfig, batch_size: int
) -> dict[str, float]:
    """eval_loss and the eval_* metrics of `model` on `rows` in batches of `batch_size` (their
    reference log-probabilities attached when the objective has a reference), one process."""
    scorer = PreferenceScorer(t, "precomputed" if rows.reference is not None else None)
    device = input_device(model)
    sums = MetricSums(device)
    weighed, sequences = 0.0, 0
    for _, _, batch in scored_batches(model, rows, collator, batch_size, device):
        out = scorer.loss(model, batch)
        sums.add(out)
        # The Trainer's evaluation repeats each batch's loss once per sequence of the batch.
        n = sequence_count(batch)
        weighed += float(out.loss) * n
        sequences += n
    return {"eval_loss": weighed / max(sequences, 1), **{f"eval_{k}": v for k, v in sums.averaged().items()}}


def _start_model(cfg: RunConfig, tokenizer: Any) -> Any:
    """The model the run started from, built as run_training builds it: fresh weights come from its seed."""
    from transformers import set_seed

    set_seed(cfg.training.seed)
    return build_model(cfg.model, tokenizer)
