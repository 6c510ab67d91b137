"""Before the first round a process runs: the run config of each site behind a login node checked
at the site, where its data and tokenizer are (`site-task check` over SSH)."""

from __future__ import annotations

import logging

from ...config.schema import FederationConfig, SiteConfig
from ...config.site_login import login_ssh_words
from ...rounds.failures import FederationError
from ...rounds.loop import site_config_file
from ...state.layout import FederationDir

__all__ = ["check_site"]

log = logging.getLogger("supertune")


def check_site(fed: FederationConfig, root: FederationDir, site: SiteConfig) -> None:
    """Before the first round this process runs: log in to the site's login node and check the
    site's run config there, where its data and tokenizer are (`site-task check`). One SSH
    login per site (about a second, plus the site's Python starting); any refusal names the
    site and its login node."""
    import shlex

    from ....entry import SITE_TASK, entry_words
    from ....subprocesses import run_captured

    assert site.login is not None and site.python is not None  # config/site_login.py requires both with login
    remote = " ".join(
        shlex.quote(str(w)) for w in [site.python, *entry_words(SITE_TASK, ["check", "--site", site.name])]
    )
    ssh = login_ssh_words(site.login, fed.streamflow.ssh_key, connect_timeout=30)
    text = site_config_file(root, site.name).read_text(encoding="utf-8")
    log.info("site %s: checking its run config at %s", site.name, site.login)
    answer = run_captured([*ssh, remote], timeout=300, input=text)
    if answer.returncode == 0:
        return
    said = [line.strip() for line in (answer.stderr + answer.stdout).splitlines() if line.strip()]
    errors = [line.removeprefix("supertune: error: ") for line in said if line.startswith(("supertune: error:", "- "))]
    reason = said[-1] if said else f"exit code {answer.returncode}"
    if answer.returncode == 255:
        # ssh's own failures (an unknown host, a refused key, no route) exit 255 and name neither site nor host.
        raise FederationError(
            f"site {site.name}: login node {site.login} cannot be used over SSH: {reason}; check sites[].login and "
            f"that `{' '.join(ssh)} true` succeeds from this machine without a prompt"
        )
    if answer.returncode == 127:
        raise FederationError(
            f"site {site.name}: {site.python} was not found at {site.login} ({reason}); set sites[].python to the "
            "site's Python with supertune installed"
        )
    if not errors:  # e.g. a supertune at the site too old for `site-task check`
        raise FederationError(
            f"site {site.name}: the check of its run config at {site.login} failed (exit code {answer.returncode}): "
            f"{reason}; install the same supertune version at the site as here"
        )
    raise FederationError(
        f"site {site.name}: its run config was refused at {site.login}, where its files are:\n  " + "\n  ".join(errors)
    )
