"""Arm (c) of bench/prepare_throughput.py: the fast tokenizer's Rust encode_batch alone, the limit.

Reads the text file's lines and encodes them in batches with the tokenizers library's own
`encode_batch_fast` (every core, no offsets), reading each encoding's ids into a Python list, which
any tool that stores the ids must do. Nothing is written. Nothing from supertune is imported.

Prints one JSON line: {"seconds": encode time (file read and tokenizer load excluded), "tokens": ids, "seconds_without_ids": ...}.

    python bench/baselines/raw_encode.py --train-file train.txt --tokenizer TOK_DIR [--batch 2000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tokenizers import Tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-file", required=True)
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (its tokenizer.json is read)")
    p.add_argument("--batch", type=int, default=2000)
    args = p.parse_args()
    tokenizer = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    lines = [line for line in Path(args.train_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    batches = [lines[i : i + args.batch] for i in range(0, len(lines), args.batch)]

    started = time.perf_counter()
    for batch in batches:
        tokenizer.encode_batch_fast(batch, add_special_tokens=False)
    without_ids = time.perf_counter() - started

    started = time.perf_counter()
    tokens = 0
    for batch in batches:
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch_fast(batch, add_special_tokens=False))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "tokens": tokens, "seconds_without_ids": without_ids}))


if __name__ == "__main__":
    main()
