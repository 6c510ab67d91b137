"""A site's agent as a chain of SLURM jobs (`supertune federate --site NAME EXCHANGE --submit`,
docs/federated/agents.md "Site agents"), on the real Slurm test cluster: the first link is stopped by the
USR1 that SLURM sends before a time limit (here sent at once with `scancel --batch --signal=USR1`),
submits the next link and ends; the next link's agent takes part in the federation's round (its
site's evaluations and training as SLURM jobs of their own, on `where`) and the chain ends with the
federation, submitting nothing more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster.slurm_cluster import SlurmCluster, wait_for_text
from slurm_fixtures import supertune
from supertune.federation.config.default import site_corpus


def _jobs(agent: Path) -> list[str]:
    path = agent / "agent-job" / "jobs.jsonl"
    return [json.loads(line)["job_id"] for line in path.read_text().splitlines()] if path.is_file() else []


def test_a_site_agent_runs_as_a_chain_of_jobs_that_ends_with_the_federation(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    profiles = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters"
    profiles.mkdir(parents=True, exist_ok=True)
    # One CPU a job: the link, and an evaluation or training job of its site beside it, fit the node's two.
    (profiles / "testcluster.yaml").write_text("description: the Slurm test cluster\ncpus_per_node: 1\n")
    exchange = tmp_path / "exchange"
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0",
                     "training.report_to=[]", "data.max_eval_samples=16"]  # fmt: skip
        # site-a's run config is a path relative to where its chain was submitted from (tmp_path)
        where = {"where": "testcluster", "config": "site-a.yaml"} if name == "site-a" else {}
        sites.append({"name": name, "overrides": overrides, "steps_per_round": 2, **where})
    (tmp_path / "site-a.yaml").write_text("training:\n  logging_steps: 1\n")
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump({
        "name": "chained", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "poll_seconds": 1,
        "executor": "agents", "exchange": str(exchange), "sites": sites}))  # fmt: skip
    agent = tmp_path / "agent-a"
    submitted = supertune("federate", "--site", "site-a", str(exchange), "--dir", str(agent), "--submit",
                          "--cluster", "testcluster", "--time", "00:10:00", env=slurm_client, cwd=tmp_path)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    first = submitted.stdout.strip()
    assert _jobs(agent) == [first] and "a link of the agent's chain" in submitted.stderr
    logs = agent / "agent-job" / "logs"
    log1 = logs / f"supertune-agent-site-a-{first}.out"
    # The coordinator has not started: the agent waits for the federation config on the exchange.
    wait_for_text(log1, f"link job {first}", timeout=60)
    slurm_single.scancel(int(first), "--batch", "--signal=USR1")  # what --signal=B:USR1@LEAD sends
    deadline = time.time() + 120
    while len(_jobs(agent)) < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert slurm_single.wait(int(first), timeout=60) == "COMPLETED", log1.read_text()
    assert len(_jobs(agent)) == 2, log1.read_text()
    second = _jobs(agent)[1]
    assert "this link's time is nearly up" in log1.read_text()

    def start(*args: str, log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "supertune", "federate", *args], env=slurm_client, cwd=tmp_path,
                                stdout=(tmp_path / log).open("w"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    coordinator = start(str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed"), log="coordinator.log")
    other = start("--site", "site-b", str(exchange), "--dir", str(tmp_path / "agent-b"), log="b.log")
    try:
        for proc, log in ((coordinator, "coordinator.log"), (other, "b.log")):
            assert proc.wait(timeout=600) == 0, (tmp_path / log).read_text()[-3000:]
    finally:
        for proc in (coordinator, other):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    log2 = logs / f"supertune-agent-site-a-{second}.out"
    assert slurm_single.wait(int(second), timeout=120) == "COMPLETED", log2.read_text()[-3000:]
    assert "every round done" in log2.read_text()
    assert _jobs(agent) == [first, second]  # the chain ended with the federation: no third link
    assert (agent / "round-001" / "site-a" / "sent").is_dir()
    # the link evaluated and trained nothing itself: its site's `where` jobs did
    assert (agent / "round-001" / "site-a" / "run" / "job.sbatch").is_file()
    assert "logging_steps: 1\n" in (agent / "round-001" / "site-a" / "site.yaml").read_text()
    assert all((agent / f"round-00{n}" / "site-a" / "evaluate" / "job.sbatch").is_file() for n in (0, 1))
    assert list((tmp_path / "fed" / "round-001" / "global").glob("*.safetensors"))


def test_the_chains_script_and_its_refusals(capsys, tmp_path: Path) -> None:
    """--dry-run prints the links' script (quoted values, USR1 lead, the same command for the next
    link) and writes nothing; each wrong use is one line naming the option."""
    from supertune.cli.main import main

    def cli(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    agent = tmp_path / "it's agent"
    code, script, _ = cli("federate", "--site", "leonardo", "ssh://me@vm.example.org/srv/fed", "--dir", str(agent),
                          "--submit", "--cluster", "leonardo", "--partition", "lrd_all_serial", "--time", "00:30:00",
                          "--dry-run")  # fmt: skip
    assert code == 0 and not agent.exists()
    assert "#SBATCH --partition=lrd_all_serial" in script and "#SBATCH --time=00:30:00" in script
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --gpus" not in script
    assert "module load" in script  # the profile's software stack, for the agent and the next submission
    quoted = "'" + str(agent).replace("'", "'\"'\"'") + "'"
    assert f"-m supertune.entry agent-link leonardo ssh://me@vm.example.org/srv/fed --dir {quoted} &" in script
    assert script.rstrip().endswith(
        f"agent-link leonardo ssh://me@vm.example.org/srv/fed --dir {quoted} --next --cluster leonardo "
        "--time 00:30:00 --partition lrd_all_serial"
    )
    for argv, expected in (
        (("--cluster", "leonardo"), "--cluster: only with --site NAME EXCHANGE --submit"),
        (("--site", "a", str(tmp_path), "--submit"), "--cluster: name the cluster profile"),
        (
            ("--site", "a", str(tmp_path), "--submit", "--cluster", "leonardo", "--time", "soon"),
            "--time: 'soon' is not a Slurm time",
        ),
        (("--site", "a", str(tmp_path), "--submit", "--cluster", "leonardo", "--time", "1"), "--time: 1 is too short"),
        (("--site", "a", "ftp://x/y", "--submit", "--cluster", "leonardo"), "EXCHANGE (with --site): 'ftp://x/y'"),
        (("--site", "a", str(tmp_path), "--submit", "--cluster", "leonard"), "--cluster: unknown cluster 'leonard'"),
        (("--site", "a", str(tmp_path), "--submit", "--cluster", "leonardo"), "holds the shipped placeholder"),
        (("--site=-all", str(tmp_path), "--submit", "--cluster", "leonardo"), "--site: '-all' is no site name"),
    ):
        code, _, err = cli("federate", *argv)
        lines = [line for line in err.splitlines() if line.startswith("supertune: error: ")]
        assert code == 2 and len(lines) == 1 and expected in lines[0], (argv, err)


def test_a_link_whose_exchange_is_unreachable_waits_and_submits_the_next_link(tmp_path: Path) -> None:
    """The links' script run by bash, with a stand-in for the Python it starts: an agent that exits
    OUTAGE_EXIT (the exchange stayed unreachable) is followed by the wait and the next link's submission
    (here cut short by the USR1 a link gets before its time limit); any other failure ends the chain."""
    from supertune.clusters.schema import ClusterProfile
    from supertune.federation.executors.agents.agent_chain import OUTAGE_EXIT, AgentChain, render_chain_script

    python = tmp_path / "python"
    python.write_text(
        '#!/bin/sh\ncase " $* " in *" --next "*) echo "$*" >> "$MARK"; exit 0;; esac\nexit "$AGENT_EXIT"\n'
    )
    python.chmod(0o755)
    chain = AgentChain("site-a", str(tmp_path / "exchange"), tmp_path / "agent", "testcluster", "00:30:00", None,
                       str(python), tmp_path)  # fmt: skip
    script = tmp_path / "link.sh"
    script.write_text(render_chain_script(chain, ClusterProfile(name="testcluster")))
    for code in (OUTAGE_EXIT, 3):
        mark = tmp_path / f"next-{code}"
        env = dict(os.environ, SLURM_JOB_ID="7", MARK=str(mark), AGENT_EXIT=str(code))
        log = tmp_path / f"link-{code}.log"
        link = subprocess.Popen(["bash", str(script)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        if code == OUTAGE_EXIT:
            deadline = time.time() + 60
            while "the exchange is unreachable" not in log.read_text() and time.time() < deadline:
                time.sleep(0.1)
            link.send_signal(signal.SIGUSR1)
        assert link.wait(timeout=60) == (0 if code == OUTAGE_EXIT else code), log.read_text()
        assert mark.is_file() == (code == OUTAGE_EXIT), log.read_text()
    assert "agent-link site-a" in (tmp_path / f"next-{OUTAGE_EXIT}").read_text()
    assert "--next --cluster testcluster --time 00:30:00" in (tmp_path / f"next-{OUTAGE_EXIT}").read_text()
