"""Arm (a) of bench/prepare_throughput.py: `supertune prepare` through its CLI entry point, in process.

The libraries every arm imports (transformers' AutoTokenizer, datasets; torch comes with them) are
imported before the clock starts, as the baselines import them at the top of their scripts; then
`supertune.cli.main.main(["prepare", ...])` runs exactly as the `supertune` command would.

Prints one JSON line: {"seconds": time of main(...), "exit": its exit code}.

    python bench/throughput/prepare_cli.py prepare --out DIR key=value ...
"""

from __future__ import annotations

import json
import sys
import time

import datasets  # noqa: F401  (imported before the clock, as in the baselines)
from transformers import AutoTokenizer  # noqa: F401

from supertune.cli.main import main

if __name__ == "__main__":
    started = time.perf_counter()
    code = main(sys.argv[1:])
    print(json.dumps({"seconds": time.perf_counter() - started, "exit": code}))
    sys.exit(code)
