"""Baseline (b): the common tutorial recipe, every document padded or truncated to a fixed length.

Plain `datasets` + `transformers`: load the text, tokenize each document with
padding="max_length" and truncation, let DataCollatorForLanguageModeling(mlm=False) copy the ids
into labels with the pads masked out, train with Trainer. Nothing from supertune is imported.

    python bench/baselines/padded_trainer.py --train-file train.txt --tokenizer TOK_DIR \
        --model-config CONFIG_DIR --training-args args.json --output-dir OUT [--max-length 512]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datasets import load_dataset
from step_clock import StepClock
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True, help="text file, one document per line")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--model-config", required=True, help="directory with the model's config.json (fresh weights)")
    p.add_argument("--training-args", required=True, help="JSON file of TrainingArguments keywords")
    p.add_argument("--output-dir", required=True, help="where the step clock and Trainer output go")
    p.add_argument("--max-length", type=int, default=512, help="every sequence is padded or truncated to this")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    out = Path(args.output_dir)
    training_kwargs = json.loads(Path(args.training_args).read_text())

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    raw = load_dataset("text", data_files={"train": args.train_file})["train"]
    # Blank lines would become sequences made only of padding; the recipe drops them first.
    raw = raw.filter(lambda row: bool(row["text"].strip()))

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=args.max_length)

    train = raw.map(encode, batched=True, remove_columns=["text"])
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)

    config = AutoConfig.from_pretrained(args.model_config)
    set_seed(training_kwargs["seed"])  # right before the weights are drawn, as supertune does
    model = AutoModelForCausalLM.from_config(config)

    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(out / "trainer"), **training_kwargs),
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[StepClock(out / "steps.jsonl")],
    )
    trainer.train()


if __name__ == "__main__":
    main()
