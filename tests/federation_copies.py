"""Copies of a finished federation's directory that tests continue from, as if trained there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml


def rehome_receipts(source: Path, target: Path) -> None:
    """Point the copied training receipts at the copied runs: a federation accepts only a receipt
    whose checkpoint lies in the site's own folder of the round (and still matches its manifest)."""
    for receipt in target.glob("round-*/*/trained.json"):
        data = json.loads(receipt.read_text(encoding="utf-8"))
        for key in ("checkpoint", "run"):
            if isinstance(data.get(key), str) and data[key].startswith(f"{source}/"):
                data[key] = str(target / Path(data[key]).relative_to(source))
        receipt.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def copy_through_round_one_training(
    source: Path, target: Path, aggregation: dict, leave_out: tuple[str, ...] = ()
) -> None:
    """A copy of a finished federation's directory as it stood after round 1's local training, with
    other aggregation settings and one round: round 1's training does not depend on how the round is
    averaged, so the copied sites' checkpoints serve every setting. `leave_out`: more top-level
    outputs of the source to leave behind (a LoRA federation's `merged`)."""

    def ignored(directory: str, names: list[str]) -> set[str]:
        here = Path(directory)
        if here == source:
            later = {n for n in names if n.startswith("round-") and n not in ("round-000", "round-001")}
            return later | {"rounds.json", "rounds.md", "rounds.png", *leave_out}
        if here == source / "round-001":
            return {"global", "averaged.json"}
        if here.parent == source / "round-001":
            return {"evaluated.json"}
        return set()

    shutil.copytree(source, target, ignore=ignored)
    rehome_receipts(source, target)
    config = yaml.safe_load((target / "federation.yaml").read_text())
    config["rounds"] = 1
    config["aggregation"].update(aggregation)
    (target / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def copy_before_average(source: Path, target: Path, number: int) -> None:
    """A copy of a finished federation's directory as it stood after round `number`'s training and its
    decisions (`left_out.json`, `started.json`), before the round's average: the round's global model,
    averaged.json and evaluations left behind, and the later rounds, with `rounds: number`."""

    def ignored(directory: str, names: list[str]) -> set[str]:
        here, rd = Path(directory), source / f"round-{number:03d}"
        if here == source:
            later = {n for n in names if n.startswith("round-") and n > rd.name}
            return later | {"rounds.json", "rounds.md", "rounds.png"}
        if here == rd:
            return {"global", "averaged.json"}
        return {"evaluated.json"} if here.parent == rd else set()

    shutil.copytree(source, target, ignore=ignored)
    rehome_receipts(source, target)
    config = yaml.safe_load((target / "federation.yaml").read_text())
    config["rounds"] = number
    (target / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
