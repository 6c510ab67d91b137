"""Baseline (c): the run_clm-style recipe, tokenized text concatenated and cut into fixed blocks with datasets.map.

Written from the description of transformers' causal-LM example script: `load_dataset("text")`,
a batched map that tokenizes, a second batched map that joins each batch of tokenized rows and
slices it into block_size pieces (the tail of each batch that does not fill a block is dropped,
labels are a copy of the ids), then Trainer with the default collator. Nothing from supertune is
imported.

    python bench/baselines/clm_group_texts.py --train-file train.txt --tokenizer TOK_DIR \
        --model-config CONFIG_DIR --training-args args.json --output-dir OUT [--block-size 512]
"""

from __future__ import annotations

import argparse
import json
from itertools import chain
from pathlib import Path

from datasets import load_dataset
from step_clock import StepClock
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True, help="text file, one row per line")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--model-config", required=True, help="directory with the model's config.json (fresh weights)")
    p.add_argument("--training-args", required=True, help="JSON file of TrainingArguments keywords")
    p.add_argument("--output-dir", required=True, help="where the step clock and Trainer output go")
    p.add_argument("--block-size", type=int, default=512, help="tokens per training sequence")
    return p.parse_args()


def cut_into_blocks(batch: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """Join every column of a batch end to end and slice it into block_size rows; labels copy input_ids."""
    joined = {name: list(chain.from_iterable(rows)) for name, rows in batch.items()}
    usable = (len(joined["input_ids"]) // block_size) * block_size
    blocks = {name: [seq[i : i + block_size] for i in range(0, usable, block_size)] for name, seq in joined.items()}
    blocks["labels"] = [list(row) for row in blocks["input_ids"]]
    return blocks


def main() -> None:
    args = parse_args()
    out = Path(args.output_dir)
    training_kwargs = json.loads(Path(args.training_args).read_text())

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    raw = load_dataset("text", data_files={"train": args.train_file})

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return tokenizer(batch["text"])

    tokenized = raw.map(encode, batched=True, remove_columns=["text"])
    blocks = tokenized.map(cut_into_blocks, batched=True, fn_kwargs={"block_size": args.block_size})

    config = AutoConfig.from_pretrained(args.model_config)
    set_seed(training_kwargs["seed"])  # right before the weights are drawn, as supertune does
    model = AutoModelForCausalLM.from_config(config)

    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(out / "trainer"), **training_kwargs),
        train_dataset=blocks["train"],
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=[StepClock(out / "steps.jsonl")],
    )
    trainer.train()


if __name__ == "__main__":
    main()
