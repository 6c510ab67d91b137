"""A federation with one site on the real Slurm test cluster (built-in executor): the site's training
and its evaluation of the global model run as SLURM jobs rendered like every `supertune submit`,
the other site trains on this machine, and the round completes with its receipts; a SLURM site that
fails is retried, then left out of a round averaged over the quorum, as is one whose job sbatch
refuses, and one held in the queue past the deadline is cancelled; a 2-node job's node-hours."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster.slurm_cluster import SlurmCluster
from supertune.federation.config.default import site_corpus

SITE = ["generate.max_new_tokens=0", "training.report_to=[]", "training.logging_steps=4", "data.max_eval_samples=24"]


def test_a_round_with_a_site_on_the_test_cluster(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    # The shipped `local` profile describes this machine and the test cluster, but `where: local`
    # means "a process here" in a federation: the cluster gets a profile of its own name.
    profiles = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters"
    profiles.mkdir(parents=True)
    (profiles / "testcluster.yaml").write_text(
        "description: the Slurm test cluster\ncpus_per_node: 2\n", encoding="utf-8"
    )
    sites = []
    for name, where in (("here", "local"), ("there", "testcluster")):
        train, validation = site_corpus("site-a" if name == "here" else "site-b")
        sites.append({"name": name, "where": where, "steps_per_round": 6,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *SITE]})  # fmt: skip
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump({"name": "fed-slurm", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1,
                                      "poll_seconds": 1, "sites": sites}), encoding="utf-8")  # fmt: skip
    fed_dir = tmp_path / "fed"
    proc = subprocess.run([sys.executable, "-m", "supertune", "federate", str(config), "--dir", str(fed_dir)],
                          env=slurm_client, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stderr
    assert "there round 1: submitted training job" in log and "there round 1: submitted evaluation job" in log
    assert "there round 0: submitted evaluation job" in log
    trained = json.loads((fed_dir / "round-001" / "there" / "trained.json").read_text())
    assert trained["step"] == 6 and trained["tokens"] == 6 * 16 * 128
    run = Path(trained["run"])
    assert (run / "job.sbatch").is_file() and list((run / "logs").glob("*.out"))  # trained by a real job
    evaluated = json.loads((fed_dir / "round-001" / "there" / "evaluated.json").read_text())
    assert (fed_dir / "round-001" / "there" / "evaluate" / "job.sbatch").is_file()
    table = json.loads((fed_dir / "rounds.json").read_text())
    [row] = [r for r in table["rows"] if r["site"] == "there"]
    assert row["global"] == evaluated["eval_loss"] < table["base"]["there"]


def test_a_slurm_site_that_fails_is_retried_then_left_out_and_the_quorum_averages(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    """site_retries, aggregation.min_sites and round_deadline with a site on SLURM. Round 1: its job fails
    (a NaN loss at step 2) at each of its 2 attempts, each a job of its own; the round is averaged over
    the local site alone and the failed jobs' node time and queue wait are in the round's cost. Round 2:
    sbatch refuses its job (a partition the cluster does not have) at both attempts; the round goes on
    with the local site. Round 3 (the local site skipped): its job is held in the queue (`scontrol
    hold`), so at the round's 10 s deadline it has not started, is cancelled, and the round, below its
    quorum, stops with the way on and forgets its start."""
    profiles = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters"
    profiles.mkdir(parents=True)
    (profiles / "testcluster.yaml").write_text(
        "description: the Slurm test cluster\ncpus_per_node: 2\n", encoding="utf-8"
    )
    sites = []
    for name, where, extra in (("here", "local", []), ("there", "testcluster", ["training.learning_rate=1e30"])):
        train, validation = site_corpus("site-a" if name == "here" else "site-b")
        sites.append({"name": name, "where": where, "steps_per_round": 2,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}",
                                    "training.warmup_steps=0", *SITE, *extra]})  # fmt: skip
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump({"name": "fed-slurm-quorum", "base_config_overrides": {"num_hidden_layers": 1},
                                      "rounds": 1, "poll_seconds": 1, "site_retries": 1, "round_deadline": "1h",
                                      "aggregation": {"min_sites": 1}, "sites": sites}), encoding="utf-8")  # fmt: skip
    fed_dir = tmp_path / "fed"
    proc = subprocess.run([sys.executable, "-m", "supertune", "federate", str(config), "--dir", str(fed_dir)],
                          env=slurm_client, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "there round 1: attempt 1 of 2 failed; trying again" in proc.stderr
    left = json.loads((fed_dir / "round-001" / "there" / "left_out.json").read_text())
    # Slurm's ExitCode of the job: its batch script's, which ends with the failed step's (1)
    reason = left["reason"]
    assert reason.startswith("failed: exit ") and reason != "failed: exit 0" and left["attempts"] == 2
    averaged = json.loads((fed_dir / "round-001" / "averaged.json").read_text())
    assert averaged["weights"] == {"here": 1.0} and averaged["left_out"] == {"there": reason}
    attempts = json.loads((fed_dir / "round-001" / "there" / "cost.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == [reason] * 2 and attempts[0]["job"] != attempts[1]["job"]
    for a in attempts:  # Slurm's own times of each job: submitted, started, ended, on one node
        assert a["nodes"] == 1 and a["submit"] <= a["start"] < a["end"], a
        # as the controller tells them now (no accounting database on the test cluster: scontrol keeps
        # finished jobs MinJobAge=3600 s)
        shown = subprocess.run(["scontrol", "--oneliner", "show", "job", a["job"]], env=slurm_client,
                               capture_output=True, text=True).stdout  # fmt: skip
        fields = dict(part.split("=", 1) for part in shown.split() if "=" in part)
        assert fields["NumNodes"] == "1" and fields["JobState"] == "FAILED", shown
        for key, name in (("submit", "SubmitTime"), ("start", "StartTime"), ("end", "EndTime")):
            assert a[key] == datetime.datetime.fromisoformat(fields[name]).timestamp(), (key, shown)
    table = json.loads((fed_dir / "rounds.json").read_text())
    [row] = [r for r in table["rows"] if r["site"] == "there"]
    spent = sum(a["end"] - a["start"] for a in attempts) / 3600
    assert row["left_out"] == reason and row["node_hours"] == pytest.approx(spent) and row["attempts"] == 2
    assert row["queue_s"] == pytest.approx(sum(a["start"] - a["submit"] for a in attempts))

    # Round 2, the same federation a round longer, the SLURM site's jobs sent to a partition the cluster
    # does not have: sbatch refuses both attempts (as it would a cluster out of reach), each an attempt of
    # the site's training with no job and no node time, and the round goes on with the local site. The
    # edit goes into the site's overrides in federation.yaml and its resolved config is removed, so the
    # next run writes it again (as the docs tell a user to).
    def edit(rounds: int, deadline: str, overrides: list[str]) -> None:
        saved = yaml.safe_load((fed_dir / "federation.yaml").read_text())
        saved.update(rounds=rounds, round_deadline=deadline)
        [there] = [site for site in saved["sites"] if site["name"] == "there"]
        there["overrides"] = [o for o in there["overrides"] if not o.startswith("slurm.partition=")] + overrides
        (fed_dir / "federation.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
        (fed_dir / "sites" / "there.yaml").unlink()

    edit(2, "1h", ["slurm.partition=nosuch"])
    refused = subprocess.run([sys.executable, "-m", "supertune", "federate", str(fed_dir)], env=slurm_client,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert refused.returncode == 0, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "there round 2: attempt 1 of 2 failed; trying again in 1s: " in refused.stderr
    left = json.loads((fed_dir / "round-002" / "there" / "left_out.json").read_text())
    said = "failed: submitting its job: sbatch failed: sbatch: error: Batch job submission failed: Invalid partition"
    assert left["reason"].startswith(said) and left["attempts"] == 2, left
    averaged = json.loads((fed_dir / "round-002" / "averaged.json").read_text())
    assert averaged["weights"] == {"here": 1.0} and averaged["left_out"] == {"there": left["reason"]}
    attempts = json.loads((fed_dir / "round-002" / "there" / "cost.json").read_text())["attempts"]
    assert attempts == [{"job": None, "nodes": None, "submit": None, "start": None, "end": None,
                         "outcome": left["reason"]}] * 2  # fmt: skip
    rows = {(r["round"], r["site"]): r for r in json.loads((fed_dir / "rounds.json").read_text())["rows"]}
    assert rows[2, "there"]["left_out"] == left["reason"] and rows[2, "there"]["attempts"] == 2
    assert rows[2, "there"]["node_hours"] == 0 and rows[2, "here"]["global"] is not None
    assert not (fed_dir / "round-002" / "there" / "run").exists()  # nothing ran: no run directory left behind

    # Round 3 with a 10 s deadline, the local site skipped, the SLURM site's partition the cluster's again.
    # A job the size of the node runs first, so that the site's job waits in the queue; once it is there
    # it is held (`scontrol hold`) and the node freed: only the hold keeps it from starting. At the
    # deadline it is cancelled, and the round, below its quorum, stops with the way on and forgets its start.
    edit(3, "10s", [])
    blocker = slurm_single.sbatch(None, "--wrap=sleep 300", "--exclusive")
    try:
        slurm_single.wait(blocker, ("RUNNING",))
        late = subprocess.Popen([sys.executable, "-m", "supertune", "federate", str(fed_dir), "--skip-site", "here"],
                                env=slurm_client, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        job = None
        while job is None and late.poll() is None:
            queue = subprocess.run(["squeue", "--noheader", "--format=%i %Z"], env=slurm_client, capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
            job = next((line.split()[0] for line in queue.splitlines() if str(fed_dir) in line), None)
            time.sleep(0.1)
        assert job is not None, late.communicate()
        subprocess.run(["scontrol", "hold", job], env=slurm_client, check=True)
    finally:
        slurm_single.scancel(blocker)
    out, err = late.communicate(timeout=600)
    assert late.returncode == 2, out[-3000:] + err[-3000:]
    reason = "late: held in the queue after 10s"
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "supertune: error: round 3: 0 of 1 sites finished training by its deadline (round_deadline 10s) and the round "
            f"needs aggregation.min_sites=1; there: {reason} (1 attempt); run `supertune federate {fed_dir}` again to go on"
        )
    )
    assert not (fed_dir / "round-003" / "started.json").exists()
    assert not (fed_dir / "round-003" / "there" / "left_out.json").exists()
    [attempt] = json.loads((fed_dir / "round-003" / "there" / "cost.json").read_text())["attempts"]
    assert attempt["job"] == job and attempt["outcome"] == reason and attempt["start"] is None
    assert attempt["end"] > attempt["submit"]  # its queue wait, until it was cancelled; no node time
    state = subprocess.run(["scontrol", "--oneliner", "show", "job", job], env=slurm_client,
                           capture_output=True, text=True).stdout  # fmt: skip
    assert "JobState=CANCELLED" in state, state
    status = subprocess.run([sys.executable, "-m", "supertune", "federate", "--status", str(fed_dir)],
                            env=slurm_client, capture_output=True, text=True).stdout  # fmt: skip
    [failed] = [line for line in status.splitlines() if line.startswith("- FAILED round 3 ")]
    assert "not finished" in failed and f"there: {reason} (1 attempt)" in failed, status


def test_the_node_hours_of_a_two_node_job_are_its_nodes_times_its_time_as_slurm_reports_them(
    slurm_multi: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site's cost (cost.py) from a real job on the two emulated nodes (`sbatch --nodes=2`, 3 s): the
    attempt read from scontrol records 2 nodes, and its node-hours are 2 x (EndTime - StartTime)."""
    from supertune.federation.state.cost import record_attempt, site_cost, slurm_attempt
    from supertune.slurm.commands import job_state

    job = slurm_multi.sbatch(None, "--nodes=2", "--wrap=sleep 3")
    slurm_multi.wait(job, ("COMPLETED",), timeout=120)
    for key, value in slurm_multi.env.items():  # Slurm's commands reach this cluster
        monkeypatch.setenv(key, value)
    record_attempt(tmp_path / "cost.json", slurm_attempt(str(job), job_state(str(job)), "finished"))
    info = slurm_multi.job_info(job)
    submit, start, end = (
        datetime.datetime.fromisoformat(info[k]).timestamp() for k in ("SubmitTime", "StartTime", "EndTime")
    )
    assert info["NumNodes"] == "2" and end - start >= 3, info
    [attempt] = json.loads((tmp_path / "cost.json").read_text())["attempts"]
    assert (attempt["nodes"], attempt["start"], attempt["end"]) == (2, start, end)
    assert site_cost(tmp_path / "cost.json") == {
        "node_hours": pytest.approx(2 * (end - start) / 3600), "queue_s": start - submit, "attempts": 1}  # fmt: skip
