"""Arm (b): the aggregation script of the recipe supertune average replaces. Every model is loaded whole
with from_pretrained (as float32), the state dicts are averaged with equal weights, and the result is
saved with save_pretrained, tokenizer included. Imports nothing from supertune.

    python bench/average/naive_from_pretrained.py --out DIR MODEL MODEL ...
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    models = [AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32) for m in args.models]
    states = [m.state_dict() for m in models]
    averaged = {name: sum(s[name] for s in states) / len(states) for name in states[0]}
    models[0].load_state_dict(averaged)
    models[0].save_pretrained(args.out)
    AutoTokenizer.from_pretrained(args.models[0]).save_pretrained(args.out)


if __name__ == "__main__":
    main()
