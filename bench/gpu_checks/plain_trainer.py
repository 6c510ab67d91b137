"""The baseline of the throughput check: what a user gets from the plain `transformers` Trainer
with its defaults, on the same model and the same text as supertune's arm.

    python bench/gpu_checks/plain_trainer.py --out DIR --model "hidden_size=...,..." --block 2048 --batch 4 --steps 20 [--bf16]

The data is the embedded corpus and tokenizer (the only text a bare machine has), tokenized and
cut into blocks the run_clm way (datasets.map, concatenate, group_texts); the model is the embedded
Llama config with the same overrides, fresh weights. TrainingArguments are the defaults except the
batch, the steps, no saving and no reporting (and bf16 with --bf16). Tokens/s counts the steps after
the first three (allocator and kernel warm-up), from the Trainer's own step-end callbacks; writes
DIR/result.json.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import chain
from pathlib import Path

import datasets
import torch
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from supertune.embedded.corpus import default_corpus
from supertune.embedded.model import default_model_config
from supertune.embedded.tokenizer import default_tokenizer

WARMUP_STEPS = 3


class StepTimes(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[tuple[float, int]] = []

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - the Trainer's callback signature
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append((time.perf_counter(), int(state.num_input_tokens_seen)))


def overrides(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", required=True, help="config overrides, k=v,k=v")
    parser.add_argument("--block", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--bf16", action="store_true")
    a = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    config = LlamaConfig(
        **default_model_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
        | overrides(a.model)
    )
    model = LlamaForCausalLM(config)

    raw = datasets.load_dataset("json", data_files=str(default_corpus().train), split="train")
    tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=raw.column_names)

    def group_texts(batch: dict) -> dict:
        joined = {k: list(chain(*batch[k])) for k in batch}
        total = len(joined["input_ids"]) // a.block * a.block
        out = {k: [v[i : i + a.block] for i in range(0, total, a.block)] for k, v in joined.items()}
        out["labels"] = [ids[:] for ids in out["input_ids"]]
        return out

    blocks = tokenized.map(group_texts, batched=True, batch_size=2000)
    args = TrainingArguments(
        output_dir=str(a.out / "trainer"),
        per_device_train_batch_size=a.batch,
        max_steps=a.steps,
        save_strategy="no",
        report_to=[],
        logging_steps=5,
        bf16=a.bf16,
        include_num_input_tokens_seen=True,
        # Only for the dry run: without it transformers refuses bf16 on a machine without a GPU.
        use_cpu=not torch.cuda.is_available(),
    )
    clock = StepTimes()
    trainer = Trainer(
        model=model, args=args, train_dataset=blocks, data_collator=default_data_collator, callbacks=[clock]
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result = trainer.train()
    # A run of WARMUP_STEPS or fewer (the memory check's two steps) measures memory, not speed.
    measured = len(clock.ends) > WARMUP_STEPS
    (t0, n0), (t1, n1) = clock.ends[min(WARMUP_STEPS, len(clock.ends)) - 1], clock.ends[-1]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "result.json").write_text(
        json.dumps(
            {
                "tokens_per_s": (n1 - n0) / (t1 - t0) if measured else None,
                "measured_steps": max(0, len(clock.ends) - WARMUP_STEPS),
                "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
                "train_loss": result.training_loss,
                # Rounded as supertune's log line gives it (millions, two decimals), to compare the arms.
                "parameters": int(round(sum(p.numel() for p in model.parameters()), -4)),
                "device": str(model.device),
                "optim": str(args.optim),
                "precision": "bf16" if a.bf16 else "fp32",
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
