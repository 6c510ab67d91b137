"""`supertune federate`: load the federation, find or create its directory, run the unfinished rounds."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import UserError
from ..output_dirs import check_output_dir, make_output_dir
from .config.load import federation_text, load_federation
from .config.schema import FederationConfig
from .modes import federation_mode
from .state.layout import FederationDir

__all__ = ["federate", "federation_plan", "federation_cost_plan", "federation_status", "federation_dir"]

log = logging.getLogger("supertune")


def federation_dir(fed: FederationConfig, resumed: Path | None, explicit: str | None) -> FederationDir:
    """The directory of this federation: the one resumed, --dir, or runs/<name>."""
    if resumed is not None:
        if explicit and Path(explicit).expanduser().absolute() != resumed:
            raise UserError(
                f"--dir: {explicit!r} differs from the federation directory given ({resumed}); give one of them"
            )
        return FederationDir(resumed)
    return FederationDir(Path(explicit or Path("runs") / fed.name).expanduser().absolute())


def federate(
    path: str | None, explicit_dir: str | None, drop: list[str] | None = None, skip: list[str] | None = None
) -> FederationDir:
    """Run (or resume) the federation in `path`, first dropping the sites in `drop` and leaving those in
    `skip` out of the next round; returns its directory."""
    from .config.executors import start_executor
    from .config.sites import resolve_sites
    from .state.history import active_federation, drop_sites, first_unfinished_round, record_failure

    fed, resumed = load_federation(path)
    mode = federation_mode(fed)
    if skip:
        mode.refuse("--skip-site")
    root = federation_dir(fed, resumed, explicit_dir)
    text = federation_text(fed)
    if root.config.is_file():
        if root.config.read_text(encoding="utf-8") != text and not _same_settings(text, root):
            raise UserError(_other_settings(fed, root))
        log.info("resuming the federation in %s", root.path)
    elif drop or skip:
        option = "--drop" if drop else "--skip-site"
        raise UserError(
            f"{option}: {root.path} holds no federation yet; leave the site out of the federation YAML instead"
        )
    else:
        # A directory of anything but this federation is refused here, before a site's config is read.
        check_output_dir(root.path, _dir_option(fed, explicit_dir), "federation (federation.yaml)")
        log.info("federation %s: %d sites, %d rounds, in %s", fed.name, len(fed.sites), fed.rounds, root.path)
    if drop:
        drop_sites(fed, root, drop)
    if skip:
        from .rounds.quorum import skip_sites

        skip_sites(fed, root, skip)
    active = active_federation(fed, root)  # without the dropped sites: the rounds still to run
    try:
        plans = resolve_sites(active)  # every site's config checked before anything is written
    except UserError as exc:
        if root.config.is_file():  # a federation under way: a site's data withdrawn, a profile gone; --status shows it
            record_failure(fed, root, first_unfinished_round(fed, root), str(exc))
        raise
    if fed.benchmarks:
        from ..benchmarks import check_tasks

        check_tasks(fed.benchmarks, "benchmarks")  # a wrong name or missing data before round 1, not after it
    if not root.config.is_file():  # made only now, so that a refused federation leaves nothing behind
        make_output_dir(root.path, _dir_option(fed, explicit_dir), "federation (federation.yaml)")
        root.config.write_text(text, encoding="utf-8")
    mode.run(active, plans, root, start_executor(active, root), everyone=fed)
    return root


def federation_plan(path: str | None, explicit_dir: str | None) -> str:
    """What `federate` would do, checked as it checks before round 1 and writing nothing: the plan, and
    the round-1 job script of every site that trains as a Slurm job (its run directory as it would be)."""
    import dataclasses

    from ..clusters.registry import load_profile
    from ..runs.submit_checks import submit_problems
    from ..slurm.jobs import render_job
    from .config.executors import dry_run_additions, executor_kind
    from .config.sites import resolve_sites

    fed, resumed = load_federation(path)
    root = federation_dir(fed, resumed, explicit_dir)
    if not root.config.is_file():
        check_output_dir(root.path, _dir_option(fed, explicit_dir), "federation (federation.yaml)")
    plans = resolve_sites(fed)
    state = "resumed from its receipts" if root.config.is_file() else "new"
    kind = executor_kind(fed)
    mode = federation_mode(fed)
    a = fed.aggregation
    lines = [
        f"# federation {fed.name}: {len(fed.sites)} sites, {mode.rounds_text(fed)}, executor {fed.executor}, "
        f"aggregation {a.weights} weights, server optimizer {a.server_optimizer}",
        f"# directory {root.path} ({state}); dry run: nothing written, nothing started",
    ]
    scripts = []
    for plan in plans:
        site, cfg = plan.site, plan.config
        place = (
            kind.place(fed, site)
            if kind.place is not None
            else f"over SSH at {site.login}"
            if site.login
            else f"as Slurm jobs on {site.where}"
            if site.where != "local"
            else f"on this machine ({cfg.launch.nproc} process(es))"
        )
        lines.append(
            f"# site {site.name}: {mode.site_text(fed, site)}, {place}, "
            + (
                "its run config read there"
                if not kind.site_files_here
                else f"strategy {cfg.distributed.strategy}, global batch {cfg.training.global_batch_size or '-'}"
            )
        )
        if site.where != "local" and not site.login and kind.site_files_here:
            run_dir = root.round(site.from_round).site(site.name).run
            named = dataclasses.replace(
                cfg, output=dataclasses.replace(cfg.output, name=f"{fed.name}-{site.name}-r{site.from_round:03d}")
            )
            profile = load_profile(site.where, what=f"sites ({site.name}).where")
            _, script = render_job(named, profile, str(run_dir))
            lines += [f"#   a real submission would be refused: {p}" for p in submit_problems(cfg, profile)]
            scripts.append(
                f"# ---- {site.name}: the job script of round {site.from_round} ({run_dir / 'job.sbatch'})\n{script}"
            )
    if fed.privacy.active:
        p = fed.privacy
        lines.append(
            f"# privacy: each site's change clipped to L2 norm {p.clip_norm:g} and noised at the site (noise "
            f"multiplier {p.noise_multiplier:g}: the round's sum carries std {p.noise_multiplier * (p.clip_norm or 0):g} "
            f"a value); epsilon reported at delta {p.delta:g}"
        )
    added, files = dry_run_additions(fed, plans, root)
    lines += added
    scripts += files
    return "\n".join(lines + scripts) + "\n"


def federation_cost_plan(path: str | None, explicit_dir: str | None, link: str | None = None) -> str:
    """The expected node-hours and bytes of the rounds still to run (cost_plan.py), and with `link` (a
    `doctor --exchange --out` file) the time of each (round_forecast.py); writes nothing."""
    from .config.sites import resolve_sites
    from .reports.cost_plan import cost_plan_text
    from .reports.round_forecast import read_link
    from .state.history import active_federation

    measured = read_link(link) if link else None
    fed, resumed = load_federation(path)
    federation_mode(fed).refuse("--plan")
    root = federation_dir(fed, resumed, explicit_dir)
    if not root.config.is_file():
        check_output_dir(root.path, _dir_option(fed, explicit_dir), "federation (federation.yaml)")
    active = active_federation(fed, root) if root.config.is_file() else fed
    return cost_plan_text(active, resolve_sites(active), root, link=measured)


def _dir_option(fed: FederationConfig, explicit_dir: str | None) -> str:
    return (
        "--dir"
        if explicit_dir
        else f"the federation directory of {fed.name!r} (runs/{fed.name}; --dir chooses another)"
    )


def _same_settings(text: str, root: FederationDir) -> bool:
    """Whether the federation saved in `root` loads to the settings `text` records: a federation.yaml
    written before a key existed lacks it, and reads as that key's default."""
    try:
        saved, _ = load_federation(root.path)
    except UserError:
        return False
    return federation_text(saved) == text


def _other_settings(fed: FederationConfig, root: FederationDir) -> str:
    """Why the YAML given is refused for the existing federation, and the way on."""
    import dataclasses

    generic = (
        f"--dir: {root.path} holds a federation with other settings; resume it with `supertune federate {root.path}` "
        "or choose another --dir"
    )
    try:
        saved, _ = load_federation(root.path)
    except UserError:  # the saved one no longer loads (a site config moved): the plain refusal
        return generic
    names = {s.name for s in fed.sites}
    missing = [s.name for s in saved.sites if s.name not in names]
    kept = dataclasses.replace(saved, sites=[s for s in saved.sites if s.name in names])
    if missing and federation_text(kept) == federation_text(fed):
        words = " ".join(f"--drop {name}" for name in missing)
        return (
            f"sites: {', '.join(missing)} left out of the YAML of the federation in {root.path}; to drop a site and keep "
            f"its rounds in the history, run `supertune federate {root.path} {words}`"
        )
    return generic


def federation_status(directory: str) -> str:
    """The per-round table of a federation directory, from its receipts alone: a machine without the
    sites' run configs or cluster profiles (a laptop, another login node) reads it too, and is told
    what it lacks to run the rounds, under the table."""
    unreadable: list[str] = []
    fed, resumed = load_federation(directory, unreadable)
    if resumed is None:
        raise UserError(f"--status: {directory!r} is not a federation directory (no federation.yaml)")
    table = federation_mode(fed).status_table(fed, FederationDir(resumed))
    if not unreadable:
        return table
    lines = ["", "## Not readable on this machine (the table needs none of it; running the rounds does)", ""]
    return table + "\n".join(lines + [f"- {line}" for line in unreadable]) + "\n"
