"""Where each site of a StreamFlow round has its files and runs its steps (cwl.SitePlace): the
federation's machine, where the average runs; a site on this machine or behind its login node; the
SLURM allocations of a SLURM site's steps; and the environment of this machine's steps."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ....errors import UserError
from ...config.schema import FederationConfig, SiteConfig
from ...config.site_login import plain_path
from ...rounds.loop import RoundWork, site_config_file
from ...state.layout import FederationDir
from .cwl import SitePlace, job_name, slurm_service

__all__ = ["federation_place", "site_place", "slurm_services", "local_env"]


def federation_place(root: FederationDir, number: int) -> SitePlace:
    """The federation's machine, where the average runs."""
    return SitePlace("federation", str(root.round(number).path), sys.executable, local_env())


def site_place(fed: FederationConfig, root: FederationDir, site: SiteConfig, work: RoundWork) -> SitePlace:
    n = work.number
    if site.login:
        assert site.workdir is not None and site.python is not None  # config/site_login.py requires both with login
        base = f"{site.workdir.rstrip('/')}/{fed.name}"
        site_dir, python, env = f"{base}/round-{n:03d}/{site.name}", site.python, {}
        workdir: str | None = f"{base}/streamflow/round-{n:03d}/{site.name}"
    else:
        site_dir, python, env, workdir = (
            str(root.round(n).site(site.name).path),
            sys.executable,
            local_env(),
            None,
        )
    services = slurm_services(fed, root, site, work, site_dir, python) if site.where != "local" else None
    return SitePlace(site.name, site_dir, python, env, site.login, workdir, services)


def slurm_services(
    fed: FederationConfig, root: FederationDir, site: SiteConfig, work: RoundWork, site_dir: str, python: str
) -> dict[str, dict[str, Any]]:
    """The SLURM allocations of the site's steps: what its job scripts ask for (job_spec)."""
    from ....clusters import load_profile
    from ....config.load import load_saved_config
    from ....slurm.job import job_spec
    from ...rounds.site_jobs import evaluation_job

    profile = load_profile(site.where, what=f"site {site.name}: where")
    # A site reached over SSH has its data and models there: only its config's types and keys are read here.
    here = not site.login
    base = load_saved_config(site_config_file(root, site.name), files_here=here)
    round_config = root.round(work.number).site(site.name).config
    trained = load_saved_config(round_config, files_here=here) if round_config.is_file() else base
    train = job_spec(trained, profile, f"{site_dir}/run", python)
    evaluate = evaluation_job(base, profile, Path(site_dir) / "evaluate", site.name, ("", "", ""))
    return {
        "train": slurm_service(train, job_name(fed, work.number, site.name, "train")),
        "evaluate": slurm_service(evaluate, job_name(fed, work.number, site.name, "evaluate")),
    }


def local_env() -> dict[str, str]:
    """HOME and the caches of this machine's steps: a CWL runner sets HOME to the step's folder,
    which would hide the Hugging Face cache, supertune's cache and the user's cluster profiles; and
    it clears the rest of the environment, PYTHONPATH included."""
    from ....paths import cache_dir

    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    env = {
        "HOME": home,
        "SUPERTUNE_CACHE": str(cache_dir().absolute()),
        "HF_HOME": os.path.abspath(os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")),
    }
    if os.environ.get("SUPERTUNE_CONFIG_DIR"):
        env["SUPERTUNE_CONFIG_DIR"] = os.path.abspath(os.path.expanduser(os.environ["SUPERTUNE_CONFIG_DIR"]))
    if os.environ.get("PYTHONPATH"):  # the steps run the supertune this federation runs (a source checkout's src)
        env["PYTHONPATH"] = ":".join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(":") if p)
    for key, value in env.items():
        if not plain_path(value):
            raise UserError(f"{key}: {value!r} must be a path of letters, digits and _./+,:@%=- with executor: streamflow "
                            "(StreamFlow exports it in a shell command unquoted)")  # fmt: skip
    return env
