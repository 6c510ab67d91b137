"""A global model's loss on one site's validation data, computed where the data is: in the
federation's own process for a local site, or as the entry point `site-eval CONFIG MODEL RECEIPT`
in a job on the site's cluster (or a StreamFlow step). The receipt is written last."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["evaluate_at_site", "add_arguments", "run"]


def evaluate_at_site(config: Path, model: Path, receipt: Path) -> dict:
    """Evaluate `model` with the data settings of the site's run config `config`; write and return the receipt."""
    from ....config.load import load_saved_config
    from ....evaluation.perplexity import evaluate_saved_model
    from ...state.receipts import write_receipt

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="SITE_CONFIG", help="the site's run config (its data settings)")
    p.add_argument("model", type=Path, metavar="MODEL_DIR", help="the global model to evaluate")
    p.add_argument("receipt", type=Path, metavar="RECEIPT", help="where the result goes (JSON), written last")


def run(args: argparse.Namespace) -> int:
    record = evaluate_at_site(args.config, args.model, args.receipt)
    print(f"supertune: eval loss {record['eval_loss']:.4f} of {args.model} on the site's validation data", flush=True)
    return 0
