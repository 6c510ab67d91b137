"""What `supertune federate --dry-run` shows of a StreamFlow federation (config/executors.py's record
names `dry_run_plan`): the `streamflow` command each round runs, and round 1's files as it writes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...config.schema import FederationConfig
from ...config.sites import SitePlan
from ...state.layout import FederationDir
from ...state.site_configs import site_config_file
from .command import streamflow_command
from .cwl import RoundFiles
from .executor import StreamFlowExecutor

__all__ = ["dry_run_plan", "dry_run_documents"]


def dry_run_plan(fed: FederationConfig, plans: list[SitePlan], root: FederationDir) -> tuple[list[str], list[str]]:
    """(the plan's lines, the files' texts) that `federate --dry-run` adds for StreamFlow."""
    line = f"# StreamFlow runs each round's workflow (its files are written per round under {root.path}): {streamflow_command(fed)}"
    files = [
        f"# ---- StreamFlow: {file}, as round 1 writes it\n{text}"
        for file, text in dry_run_documents(fed, plans, root).items()
    ]
    return [line], files


def dry_run_documents(fed: FederationConfig, plans: list[SitePlan], root: FederationDir) -> dict[Path, str]:
    """StreamFlow's files of round 1 as a new federation in `root` writes them when round 1 starts
    ({path under root: text}), for `federate --dry-run`; nothing is written under root.

    They are made in a temporary copy of the federation directory (the sites' configs written there,
    as a real run writes them, and standing for round 1's resolved configs), whose path is then
    replaced by root's in the texts; the temporary copy is removed. A resumed federation writes the same files
    for the rounds it has left, less the phases already done. The federation's id is made when the
    federation starts: the texts show <federation id> in its place. No login node is reached."""
    import tempfile

    from ...config.lora_modes import lora_sites
    from ...rounds.loop import round_work

    with tempfile.TemporaryDirectory(prefix="supertune-dry-run-") as tmp:
        scratch = FederationDir(Path(tmp) / "federation")
        for plan in plans:
            path = site_config_file(scratch, plan.site.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(plan.text, encoding="utf-8")
        base = Path(fed.base_model) if fed.base_model else scratch.round(0).global_model
        adapters = lora_sites(fed, [p.config for p in plans]) == "adapters"
        previous = scratch.round(0).path / "adapter" if adapters else base
        for plan in plans:
            # Round 1's resolved config differs from the site's only in its steps and start model
            # (built when the federation starts), which no StreamFlow file holds: the file's path is given.
            config = scratch.round(1).site(plan.site.name).config
            config.parent.mkdir(parents=True)
            config.write_text(plan.text, encoding="utf-8")
        work = round_work(fed, plans, scratch, 1, previous, base)
        work.federation_id = "<federation id>"
        executor = StreamFlowExecutor(fed, scratch)
        files = RoundFiles(scratch.streamflow / "round-001")
        places = executor.site_places(work)
        if executor.robust():  # round 1 starts with its training alone (run_round)
            work = dataclasses.replace(work, average=False, evaluate=[])
        _, _, documents = executor.documents(work, places, files, report_failure=executor.robust())
        here, there = str(scratch.path), str(root.path)
        return {Path(str(p).replace(here, there, 1)): text.replace(here, there) for p, text in documents.items()}
