"""Copies of a finished federation's directory that tests continue from, as if trained there."""

from __future__ import annotations

import json
from pathlib import Path


def rehome_receipts(source: Path, target: Path) -> None:
    """Point the copied training receipts at the copied runs: a federation accepts only a receipt
    whose checkpoint lies in the site's own folder of the round (and still matches its manifest)."""
    for receipt in target.glob("round-*/*/trained.json"):
        data = json.loads(receipt.read_text(encoding="utf-8"))
        for key in ("checkpoint", "run"):
            if isinstance(data.get(key), str) and data[key].startswith(f"{source}/"):
                data[key] = str(target / Path(data[key]).relative_to(source))
        receipt.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
