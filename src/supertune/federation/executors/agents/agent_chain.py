"""A site's agent as a chain of SLURM jobs: `supertune federate --site NAME EXCHANGE --submit`.

For a site whose login nodes do not keep a process running for days: each link is a short job (one
task, no GPU; on a partition whose nodes may connect out to the exchange) that runs the agent until
SLURM's USR1 comes `LEAD` seconds before its time limit. The job script then stops the agent (which
is safe at any moment: run again, it picks up where it was, and a site training job it submitted
stays queued and is waited for, not submitted twice) and submits the next link (entry point
`agent-link --next`, which plans, renders and submits as `--submit` did: the same script). The chain ends with the agent: after the
federation's last round (exit 0), or at the agent's first error (its status, with the error in the
link's log), never by resubmitting a failure. An exchange that stays unreachable through the
exchange's own retries is not a failure of the federation but an outage (a VM rebooting, a network
down for an hour): the agent exits OUTAGE_EXIT, and the link waits OUTAGE_WAIT seconds (or until its
USR1) and submits the next link, which tries again; each link of an outage costs its queue wait and
a minute or so of one CPU.

Every link's job id is appended to `DIR/agent-job/jobs.jsonl` and its log is
`DIR/agent-job/logs/<job name>-<job id>.out`, DIR being the agent's directory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ....config.job_values import time_problem, time_seconds
from ....errors import UserError
from ....exchange import parse_exchange
from ....rundir import RunDir
from .exchange_wait import OUTAGE_WAIT

if TYPE_CHECKING:
    from ....clusters.schema import ClusterProfile

__all__ = ["AgentChain", "plan_chain", "render_chain_script", "submit_chain", "CHAIN_DIR", "DEFAULT_TIME",
           "OUTAGE_EXIT"]  # fmt: skip

CHAIN_DIR = "agent-job"
"""The chain's script, logs and job records, inside the agent's directory."""
DEFAULT_TIME = "04:00:00"
OUTAGE_EXIT = 75
"""The agent's exit status when the exchange stayed unreachable (sysexits' EX_TEMPFAIL: try again later)."""
LEAD = 120
"""Seconds before a link's time limit at which it stops the agent and submits the next link: enough
for a Python start and one sbatch on a busy login node. SLURM may send the signal up to a minute
earlier than asked (its event resolution), which costs nothing here."""


@dataclass(frozen=True)
class AgentChain:
    site: str
    exchange: str
    directory: Path
    """The agent's directory (absolute): its rounds, runs, receipts, and CHAIN_DIR."""
    cluster: str
    time: str
    partition: str | None
    python: str
    workdir: Path
    """Where the chain was submitted from: every link runs there, so the site's `config:` and other
    relative paths mean what they meant to the user (sbatch would start it in the job's directory)."""

    @property
    def job_dir(self) -> RunDir:
        return RunDir(self.directory / CHAIN_DIR)

    @property
    def lead(self) -> int:
        """LEAD, or a quarter of a link shorter than 8 minutes (a test's, say)."""
        return min(LEAD, max(10, time_seconds(self.time) // 4))

    def link_words(self, *, submit_next: bool) -> list[object]:
        """What a link runs: the agent, or (`submit_next`) the submission of the next link, which
        plans, renders and submits exactly as `--submit` did."""
        from ....entry import AGENT_LINK, entry_words

        args = [self.site, self.exchange, "--dir", str(self.directory)]
        if submit_next:
            args += ["--next", "--cluster", self.cluster, "--time", self.time]
            args += ["--partition", self.partition] if self.partition else []
        return [self.python, *entry_words(AGENT_LINK, args)]


def plan_chain(
    site: str, exchange: str, directory: str | None, cluster: str | None, time: str | None, partition: str | None
) -> tuple[AgentChain, ClusterProfile]:
    """The chain from the command line, every value checked; nothing is read from the exchange (the
    coordinator need not have started) and nothing is written."""
    from ....clusters import load_profile
    from ...config.load import SITE_NAME

    problems = []
    if not SITE_NAME.match(site):
        problems.append(
            f"--site: {site!r} is no site name (letters, digits, '_' and '-', starting with a letter or digit)"
        )
    if not cluster:
        problems.append(
            "--cluster: name the cluster profile whose SLURM runs the agent's jobs, e.g. --cluster leonardo "
            "(supertune clusters list)"
        )
    limit = time or DEFAULT_TIME
    if (problem := time_problem(limit)) is not None:
        problems.append(f"--time: {problem}")
    elif time_seconds(limit) < 120:
        problems.append(f"--time: {limit} is too short for a link of the chain; give at least 00:02:00")
    if problems:
        raise UserError("; ".join(problems))
    parse_exchange(exchange, "EXCHANGE (with --site)")
    assert cluster is not None
    profile = load_profile(cluster, what="--cluster")
    where = Path(directory or Path("runs") / f"{site}-agent").expanduser().absolute()
    chain = AgentChain(
        site, exchange, where, cluster, limit, partition or profile.partition, sys.executable, Path.cwd().absolute()
    )
    return chain, profile


def render_chain_script(chain: AgentChain, profile: ClusterProfile) -> str:
    """The job script of every link, a pure function of the chain and the profile; each value quoted."""
    from ....slurm.script import comment, directives, env_name, modules_section, site_options
    from ....slurm.shell import env_value, join, quote, sbatch_value, slurm_filename

    logs = slurm_filename("--dir", str(chain.job_dir.logs))
    options: list[tuple[str, object | None]] = [
        ("job-name", sbatch_value("--site", f"supertune-agent-{chain.site}")),
        ("nodes", 1),
        ("ntasks", 1),
        ("cpus-per-task", max(1, profile.cpus_per_gpu)),
        *site_options(chain.time, chain.partition, profile.account, profile.qos, None),
        ("output", sbatch_value("--dir", f"{logs}/%x-%j.out")),
        ("error", sbatch_value("--dir", f"{logs}/%x-%j.err")),
        ("open-mode", "append"),
        ("signal", f"B:USR1@{chain.lead}"),
    ]
    lines = [
        "#!/bin/bash",
        f"# One link of the supertune agent of site {comment(chain.site)} (exchange {comment(chain.exchange)}):",
        f"# it runs the agent until USR1, {chain.lead} s before its time limit, then submits the next link.",
        "# Rendered by `supertune federate --site ... --submit`; run that again rather than edit this.",
        *directives(options),
    ]
    sections = ["\n".join(lines), "set -euo pipefail", modules_section(profile)]
    env = [f"export {env_name(name)}={env_value(str(value))}" for name, value in profile.env.items()]
    if env:
        sections.append("\n".join(["# Environment of the cluster profile", *env]))
    sections.append(
        f"# Where the chain was submitted from: the site's relative paths are read from there\ncd -- {quote(str(chain.workdir))}"
    )
    sections.append(_LINK.replace("@AGENT@", join(chain.link_words(submit_next=False)))
                    .replace("@NEXT@", join(chain.link_words(submit_next=True)))
                    .replace("@SITE@", quote(chain.site))
                    .replace("@OUTAGE@", str(OUTAGE_EXIT)).replace("@WAIT@", str(OUTAGE_WAIT)))  # fmt: skip
    return "\n\n".join(s for s in sections if s) + "\n"


# The agent runs in the background so that the trap runs as soon as USR1 arrives (bash runs a trap
# only between commands, and `wait` returns at a trapped signal). A USR1 before the agent has
# started is kept in link_ends and acted on once it has.
_LINK = """\
# The agent, until this link's time is nearly up; then the next link
link_ends=0
agent_pid=
# shellcheck disable=SC2317  # called by the trap
end_link() {
  link_ends=1
  echo "supertune: USR1: this link's time is nearly up; the agent stops and the next link is submitted"
  if [ -n "$agent_pid" ]; then kill -TERM "$agent_pid" 2>/dev/null || true; fi
}
trap end_link USR1
@AGENT@ &
agent_pid=$!
echo "supertune: agent of site "@SITE@", link job ${SLURM_JOB_ID}"
if [ "$link_ends" = 1 ]; then kill -TERM "$agent_pid" 2>/dev/null || true; fi
while kill -0 "$agent_pid" 2>/dev/null; do wait "$agent_pid" || true; done
status=0
wait "$agent_pid" || status=$?
if [ "$status" = @OUTAGE@ ] && [ "$link_ends" != 1 ]; then
  # the exchange stayed unreachable (above): an outage, not an error; wait, then the next link tries again
  echo "supertune: the exchange is unreachable; the next link is submitted in @WAIT@ s"
  sleep @WAIT@ &
  agent_pid=$!
  if [ "$link_ends" = 1 ]; then kill -TERM "$agent_pid" 2>/dev/null || true; fi
  wait "$agent_pid" || true
  link_ends=1
fi
if [ "$link_ends" != 1 ]; then
  # every round done (0), or the agent's error above: the chain ends here
  exit "$status"
fi
@NEXT@"""


def submit_chain(chain: AgentChain, script: str) -> str:
    """Write the links' script and submit one link; its job id is recorded in the chain's jobs.jsonl."""
    from ....slurm.jobs import submit_job

    jobs = chain.job_dir
    jobs.logs.mkdir(parents=True, exist_ok=True)
    jobs.job_script.write_text(script, encoding="utf-8")
    return submit_job(jobs, chain.cluster)
