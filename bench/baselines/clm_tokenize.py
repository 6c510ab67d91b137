"""Baseline (b) of bench/prepare_throughput.py: the run_clm-style way to get training blocks from text.

Written from the description of transformers' causal-LM example script: `load_dataset("text")`, a
batched `datasets.map` that tokenizes with the tokenizer's __call__ (num_proc worker processes),
a second batched map that joins each batch of 1,000 tokenized rows and cuts it into block_size
pieces (labels are a copy of the ids). The result is cached by datasets as Arrow files, which is
what a later training run reads. Nothing from supertune is imported.

Prints one JSON line: {"seconds": time from after the imports to the grouped dataset, "tokens": ids produced}.

    python bench/baselines/clm_tokenize.py --train-file train.txt --tokenizer TOK_DIR [--num-proc 2] [--block-size 512]
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import chain

from datasets import load_dataset
from transformers import AutoTokenizer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True, help="text file, one row per line")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--num-proc", type=int, default=2, help="datasets.map worker processes")
    p.add_argument("--block-size", type=int, default=512, help="tokens per block")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    raw = load_dataset("text", data_files={"train": args.train_file})["train"]

    def tokenize(batch):
        return tokenizer(batch["text"])

    tokenized = raw.map(tokenize, batched=True, num_proc=args.num_proc, remove_columns=["text"])

    def group(batch):
        joined = {k: list(chain.from_iterable(v)) for k, v in batch.items()}
        usable = len(joined["input_ids"]) // args.block_size * args.block_size
        out = {k: [v[i : i + args.block_size] for i in range(0, usable, args.block_size)] for k, v in joined.items()}
        out["labels"] = [list(x) for x in out["input_ids"]]
        return out

    blocks = tokenized.map(group, batched=True, num_proc=args.num_proc)
    seconds = time.perf_counter() - started
    tokens = sum(len(x) for x in tokenized["input_ids"])  # counted after the clock stopped
    print(json.dumps({"seconds": seconds, "tokens": tokens, "blocks": len(blocks)}))


if __name__ == "__main__":
    main()
