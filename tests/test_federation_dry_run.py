"""`supertune federate --dry-run`: every site's config checked, the plan and each Slurm site's job script
printed, and nothing written or started."""

from __future__ import annotations

import pytest

from supertune.cli.main import main
from supertune.config.errors import ConfigError
from supertune.federation import load_federation

FEDERATION = """\
name: plan-test
rounds: 2
sites:
  - name: here
    steps_per_round: 4
    overrides: [training.warmup_steps=0]
  - name: leo
    where: leonardo
    steps_per_round: 8
    from_round: 2
    overrides: [training.warmup_steps=0, slurm.account=EUHPC_X]
"""


def test_the_plan_and_the_job_scripts_without_a_file_written(tmp_path, capsys) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text(FEDERATION)
    fed_dir = tmp_path / "runs" / "plan-test"
    assert main(["federate", str(config), "--dry-run", "--dir", str(fed_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1] == f"# directory {fed_dir} (new); dry run: nothing written, nothing started"
    assert lines[2].startswith("# site here: rounds 1-2, 4 steps each, on this machine (1 process(es))")
    assert lines[3].startswith("# site leo: rounds 2-2, 8 steps each, as Slurm jobs on leonardo")
    assert f"# ---- leo: the job script of round 2 ({fed_dir}/round-002/leo/run/job.sbatch)" in lines
    assert "#SBATCH --account=EUHPC_X" in out and "#SBATCH --job-name=plan-test-leo-r002" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.yaml"]
    # a refusal is the same as a real run's, and leaves nothing either
    assert main(["federate", str(config), "--dry-run", "--dir", str(config)]) == 2
    assert f"--dir: {config} is a file" in capsys.readouterr().err


def test_a_count_of_rounds_past_any_federation_is_refused_before_the_rounds_are_walked(tmp_path, capsys) -> None:
    """10^12 rounds (a typo, or a damaged federation.yaml) took hours in the checks that walk every round."""
    config = tmp_path / "federation.yaml"
    config.write_text(FEDERATION.replace("rounds: 2", "rounds: 1000000000000"))
    assert main(["federate", str(config), "--dry-run", "--dir", str(tmp_path / "fed")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("rounds: at most 10000 (each round is a folder and a row of the table), got 1000000000000")
    )
    # a federation directory whose federation.yaml claims as many: --status answers the same
    assert main(["federate", "--status", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("got 1000000000000")


def test_status_reads_the_receipts_where_the_sites_profiles_and_configs_are_not(tmp_path, capsys) -> None:
    """--status on a machine without the sites' cluster profiles or run configs (a copy of the directory
    on a laptop): the table, and under it what this machine lacks, instead of the loader's refusal."""
    fed_dir = tmp_path / "fed"
    fed_dir.mkdir()
    (fed_dir / "federation.yaml").write_text(
        FEDERATION.replace("where: leonardo", "where: elsewhere-cluster") + "    config: /nowhere/site-leo.yaml\n"
    )
    (fed_dir / "round-000" / "here").mkdir(parents=True)
    (fed_dir / "round-000" / "here" / "evaluated.json").write_text('{"eval_loss": 2.5}')
    assert main(["federate", "--status", str(fed_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Federation plan-test: 0 of 2 rounds") and "base model: here 2.5000, leo -" in out
    unreadable = out.split("## Not readable on this machine")[1].splitlines()[2:]
    assert (
        unreadable[0]
        == "- sites[1] (leo).config: '/nowhere/site-leo.yaml' does not exist; give the site's run config YAML"
    )
    assert unreadable[1].startswith("- ") and "elsewhere-cluster" in unreadable[1]
    # running it (which loads it so) is still refused, naming the same
    with pytest.raises(ConfigError, match="elsewhere-cluster"):
        load_federation(fed_dir)
