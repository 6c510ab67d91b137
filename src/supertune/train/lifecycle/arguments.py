"""TrainingArguments from the training section: same names, plus what the run directory decides."""

from __future__ import annotations

from typing import Any

from ...config.schema import RunConfig
from ...rundir import RunDir
from ..trainer.progress import progress_bar_wanted

__all__ = ["training_arguments", "PASSED_THROUGH"]

# Fields of TrainingConfig handed to TrainingArguments unchanged (the names are the Trainer's).
PASSED_THROUGH = (
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "eval_strategy",
    "eval_steps",
    "save_strategy",
    "save_steps",
    "logging_steps",
    "seed",
    "full_determinism",
    "bf16",
    "fp16",
    "torch_compile",
    "dataloader_num_workers",
    "ddp_timeout",
)


def training_arguments(cfg: RunConfig, run: RunDir, strategy: dict[str, Any] | None = None) -> Any:
    """The TrainingArguments of a run; checkpoints go to RunDir.checkpoints.

    `strategy`: keywords of distributed.strategy (deepspeed=...; save_only_model for fsdp, whose model is sharded before; none for ddp).
    """
    import torch
    from transformers import TrainingArguments

    t = cfg.training
    kwargs: dict[str, Any] = {name: getattr(t, name) for name in PASSED_THROUGH}
    kwargs.update(strategy or {})
    if t.data_seed is not None:
        kwargs["data_seed"] = t.data_seed
    if t.warmup_steps < 1:
        kwargs["warmup_steps"] = float(t.warmup_steps)  # a fraction of all steps
    else:
        kwargs["warmup_steps"] = int(t.warmup_steps)
    return TrainingArguments(
        output_dir=str(run.checkpoints),
        # Old checkpoints are removed by supertune.checkpoints.layout (training.save_total_limit),
        # which never removes the one `latest` names.
        save_total_limit=None,
        report_to=[],  # TensorBoard is attached by supertune with its own log dir (see callbacks)
        include_num_input_tokens_seen="non_padding",
        logging_first_step=True,
        remove_unused_columns=False,
        disable_tqdm=not progress_bar_wanted(),  # a job log gets ProgressLines instead
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning is meaningless (and warns) without a GPU
        # Without use_cpu, accelerate sees no GPU and treats a torchrun job as a single process. With
        # DeepSpeed it must stay off: use_cpu makes accelerate drop DeepSpeed for plain DDP (the
        # process count is repaired afterwards, see supertune.distributed.deepspeed_runtime).
        use_cpu=not torch.cuda.is_available() and "deepspeed" not in kwargs,
        # Every parameter that trains takes part in a causal LM's forward pass (LoRA's frozen base
        # weights do not count), so DDP need not search the graph for unused ones after each
        # backward; left to the Trainer it searches, and warns on every rank that it found none.
        ddp_find_unused_parameters=False,
        **kwargs,
    )
