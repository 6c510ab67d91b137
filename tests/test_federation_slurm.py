"""A federation with one site on the real Slurm test cluster (built-in executor): the site's training
and its evaluation of the global model run as SLURM jobs rendered like every `supertune submit`,
the other site trains on this machine, and the round completes with its receipts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
