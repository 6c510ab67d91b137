"""The settings every arm shares, in one place, and their two spellings (supertune keys, TrainingArguments)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BenchSettings"]


@dataclass(frozen=True)
class BenchSettings:
    """Model-independent knobs of a benchmark run; identical for all arms by construction."""

    steps: int = 32
    """Optimizer steps per arm."""
    batch_size: int = 8
    """Sequences per optimizer step (one process, no gradient accumulation)."""
    seq_len: int = 512
    """supertune's packed block size, the padded recipe's max_length, the grouped recipe's block size."""
    learning_rate: float = 2e-3
    warmup_steps: int = 4
    lr_scheduler_type: str = "cosine"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 42
    tokenizer_vocab_size: int = 4096
    threads: int | None = None
    """torch threads per arm (OMP_NUM_THREADS); None: torch's default, one per core."""

    def training_arguments(self) -> dict[str, Any]:
        """TrainingArguments keywords of the baselines; the same values supertune's run config turns into."""
        return {
            "max_steps": self.steps,
            "per_device_train_batch_size": self.batch_size,
            "gradient_accumulation_steps": 1,
            "learning_rate": self.learning_rate,
            "lr_scheduler_type": self.lr_scheduler_type,
            "warmup_steps": self.warmup_steps,
            "weight_decay": self.weight_decay,
            "adam_beta1": self.adam_beta1,
            "adam_beta2": self.adam_beta2,
            "adam_epsilon": self.adam_epsilon,
            "max_grad_norm": self.max_grad_norm,
            "optim": "adamw_torch",
            "seed": self.seed,
            # A log line every step gives every arm a per-step clock at the same small cost.
            "logging_steps": 1,
            "logging_first_step": True,
            "save_strategy": "no",
            "report_to": "none",
            "dataloader_num_workers": 0,
            "dataloader_pin_memory": False,
            "include_num_input_tokens_seen": "non_padding",
        }

    def supertune_overrides(self) -> list[str]:
        """`section.key=value` overrides giving supertune's Trainer the same optimisation as the baselines."""
        t = self.training_arguments()
        same = [
            "max_steps",
            "per_device_train_batch_size",
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
            "seed",
            "logging_steps",
            "save_strategy",
            "dataloader_num_workers",
        ]
        return [f"training.{k}={t[k]}" for k in same] + ["training.report_to=[]"]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
