"""A federation with one site on the real Slurm test cluster (built-in executor): the site's training
and its evaluation of the global model run as SLURM jobs rendered like every `supertune submit`,
the other site trains on this machine, and the round completes with its receipts; a SLURM site that
fails is retried, then left out of a round averaged over the quorum."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.slurm_cluster import SlurmCluster
from supertune.federation.default import site_corpus

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
    the local site alone and the failed jobs' node time and queue wait are in the round's cost. Round 2
    (the local site skipped): its job may not start before 60 s after its submission (sbatch --begin),
    so at the round's 10 s deadline it is still queued, is cancelled, and the round, below its quorum,
    stops with the way on and forgets its start."""
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

    # Round 2, the same federation a round longer with a 10 s deadline, its local site skipped, and the
    # SLURM site's jobs held back 60 s: the edit goes into the site's overrides in federation.yaml and
    # its resolved config is removed, so the next run writes it again (as the docs tell a user to).
    saved = yaml.safe_load((fed_dir / "federation.yaml").read_text())
    saved.update(rounds=2, round_deadline="10s")
    [there] = [site for site in saved["sites"] if site["name"] == "there"]
    there["overrides"].append("slurm.extra_args=[--begin=now+60]")
    (fed_dir / "federation.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    (fed_dir / "sites" / "there.yaml").unlink()
    late = subprocess.run([sys.executable, "-m", "supertune", "federate", str(fed_dir), "--skip-site", "here"],
                          env=slurm_client, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert late.returncode == 2, late.stdout[-3000:] + late.stderr[-3000:]
    assert (
        late.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "supertune: error: round 2: 0 of 1 sites finished training by its deadline (round_deadline 10s) and the round "
            "needs aggregation.min_sites=1; there: late: still queued after 10s (1 attempt); "
            f"run `supertune federate {fed_dir}` again to go on"
        )
    )
    assert not (fed_dir / "round-002" / "started.json").exists()
    assert not (fed_dir / "round-002" / "there" / "left_out.json").exists()
    [attempt] = json.loads((fed_dir / "round-002" / "there" / "cost.json").read_text())["attempts"]
    assert attempt["outcome"] == "late: still queued after 10s" and attempt["start"] is None
    assert attempt["end"] > attempt["submit"]  # its queue wait, until it was cancelled; no node time
    state = subprocess.run(["scontrol", "--oneliner", "show", "job", attempt["job"]], env=slurm_client,
                           capture_output=True, text=True).stdout  # fmt: skip
    assert "JobState=CANCELLED" in state, state
