"""A global model's loss on one site's validation data, computed where the data is: in the
federation's own process for a local site, or as `python -m supertune.federation.site_eval CONFIG
MODEL RECEIPT` in a job on the site's cluster (or a StreamFlow step). The receipt is written last."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import UserError

__all__ = ["evaluate_at_site", "main"]


def evaluate_at_site(config: Path, model: Path, receipt: Path) -> dict:
    """Evaluate `model` with the data settings of the site's run config `config`; write and return the receipt."""
    from ..config.load import load_saved_config
    from ..evaluation.perplexity import evaluate_saved_model
    from .receipts import write_receipt

    started = time.time()
    metrics = evaluate_saved_model(str(model), load_saved_config(config))
    record = {
        "eval_loss": metrics["eval_loss"],
        "eval_tokens": metrics["tokens"],
        "model": str(model),
        "started_unix": started,
        "seconds": time.time() - started,
    }
    write_receipt(receipt, record)
    return record


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m supertune.federation.site_eval SITE_CONFIG MODEL_DIR RECEIPT", file=sys.stderr)
        return 2
    try:
        record = evaluate_at_site(Path(args[0]), Path(args[1]), Path(args[2]))
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2
    print(f"supertune: eval loss {record['eval_loss']:.4f} of {args[1]} on the site's validation data", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
