"""Rounds that do not wait forever for one site: a site whose training dies in round 2 only (retried,
left out, back in round 3, the table says why); a site still training at the round's deadline (2
processes) is ended and left out; a round below its quorum at the deadline stops with the way on, and
`--skip-site` takes that way. After each of those decisions a SIGKILL in the average resumes to the
same global model, byte for byte, and so does a SIGKILL at the other phases of a round that leaves
sites out: between two sites' left_out receipts, in training and in evaluation under a deadline. Also the duration syntax of round_deadline, the cost columns every
round gets (a local site's node-hours: its processes x wall time), and the plot against node-hours."""

from __future__ import annotations

import json
import logging
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from federation_cli import federate_cli
from federation_copies import copy_before_average, copy_through_round_one_training, rehome_receipts
from supertune.federation.config.default import site_corpus
from supertune.federation.config.durations import deadline_problem, deadline_seconds, duration_text
from supertune.federation.config.load import federation_problems
from supertune.federation.config.schema import FederationConfig, SiteConfig

SITE = ["generate.max_new_tokens=0", "training.report_to=[]", "training.warmup_steps=0", "data.max_eval_samples=8"]


def test_round_deadline_reads_durations_and_refuses_the_rest() -> None:
    assert [deadline_seconds(t) for t in ("2h", "90m", "1h30m", "45s", "7200", "1.5h", None, "")] == [
        7200, 5400, 5400, 45, 7200, 5400, None, None]  # fmt: skip
    assert deadline_problem("2h") is None and deadline_problem("90") is None
    assert deadline_problem("2 hours") == (
        "round_deadline: '2 hours' is not a duration; write e.g. 2h, 90m, 1h30m or a number of seconds"
    )
    assert (
        deadline_problem("0")
        == "round_deadline: must be a positive duration (e.g. 2h), got '0'; leave it empty for none"
    )
    assert [duration_text(s) for s in (20, 5400, 7200, 600, 207, 3605)] == ["20s", "1h30m", "2h", "10m", "3m27s", "1h"]
    fed = FederationConfig(rounds=1, round_deadline="soon", sites=[SiteConfig(name="a"), SiteConfig(name="b")])
    assert federation_problems(fed) == [
        "round_deadline: 'soon' is not a duration; write e.g. 2h, 90m, 1h30m or a number of seconds"
    ]
    fed.executor, fed.round_deadline = "streamflow", "2h"
    assert federation_problems(fed) == []


def test_a_command_still_running_at_its_deadline_is_ended_with_its_children(tmp_path: Path) -> None:
    """run_logged_until: a shell that started a child of its own (as torchrun starts workers) is ended
    as a group when the deadline passes, the child too; one that finishes in time gives its exit code."""
    from supertune.subprocesses import run_logged_until

    marker = str(tmp_path / "still-here")
    started = time.time()
    code = run_logged_until(["sh", "-c", f'sh -c "sleep 300; : {marker}" & sleep 301'], tmp_path / "log", started + 1.5,
                            grace=5)  # fmt: skip
    assert code is None
    time.sleep(0.3)
    alive = [p for p in Path("/proc").glob("[0-9]*/cmdline") if marker in p.read_bytes().decode(errors="replace")]
    assert not alive
    assert run_logged_until(["sh", "-c", "echo done; exit 3"], tmp_path / "log", time.time() + 60) == 3
    assert (tmp_path / "log").read_text() == "done\n"


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 rounds of 2 sites x 2 steps; site-b's training is killed (SIGKILL, as when its node dies) at
    step 1 of round 2, at every attempt, and nowhere else."""
    root = tmp_path_factory.mktemp("deadline")
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        sites.append({"name": name, "steps_per_round": 2,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *SITE]})  # fmt: skip
    config = {"name": "fed-deadline", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 3,
              "site_retries": 1, "round_deadline": "2h", "aggregation": {"min_sites": 1}, "sites": sites}  # fmt: skip
    path = root / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    fed_dir = root / "fed"
    fault = {"SUPERTUNE_FAULT": "step@1", "SUPERTUNE_FAULT_IN": "round-002/site-b/"}
    proc = federate_cli(str(path), "--dir", str(fed_dir), env=fault)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "site-b round 2: attempt 1 of 2 failed; trying again" in proc.stderr
    return fed_dir


@pytest.mark.slow
def test_a_site_that_fails_in_round_two_only_is_left_out_and_rejoins(failing: Path) -> None:
    left = json.loads((failing / "round-002" / "site-b" / "left_out.json").read_text())
    assert left["reason"] == "failed: killed by signal 9" and left["attempts"] == 2
    averaged = json.loads((failing / "round-002" / "averaged.json").read_text())
    assert averaged["weights"] == {"site-a": 1.0} and averaged["left_out"] == {"site-b": "failed: killed by signal 9"}
    # round 3: site-b is back, from round 2's global model like site-a
    for name in ("site-a", "site-b"):
        site = yaml.safe_load((failing / "round-003" / name / "site.yaml").read_text())
        assert site["model"]["name_or_path"] == str(failing / "round-002" / "global")
    assert set(json.loads((failing / "round-003" / "averaged.json").read_text())["weights"]) == {"site-a", "site-b"}
    # both failed attempts cost node time, recorded; the round table says why the site is missing
    attempts = json.loads((failing / "round-002" / "site-b" / "cost.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed: killed by signal 9"] * 2
    table = json.loads((failing / "rounds.json").read_text())
    rows = {(r["round"], r["site"]): r for r in table["rows"]}
    assert len(rows) == 6 and rows[2, "site-b"]["left_out"] == "failed: killed by signal 9"
    assert rows[2, "site-b"]["tokens"] is None and rows[2, "site-b"]["node_hours"] > 0
    assert all(r["node_hours"] > 0 and r["queue_s"] == 0 and r["attempts"] for r in rows.values())
    assert rows[1, "site-a"]["sent_bytes"] == rows[1, "site-a"]["received_bytes"] > 0
    assert table["totals"]["node_hours"] == pytest.approx(sum(r["node_hours"] for r in rows.values()))
    row = rows[3, "site-a"]  # its loss under round 3's global model against round 2's, per node-hour
    assert row["loss_change_per_node_hour"] == pytest.approx((row["global"] - row["local_before"]) / row["node_hours"])
    assert row["loss_change_per_node_hour"] < 0
    markdown = (failing / "rounds.md").read_text()
    assert "| 2 | site-b | - |" in markdown and "left out: failed: killed by signal 9 |" in markdown
    assert (
        "node-hours (every training attempt's wall time x its nodes on SLURM, x its processes on this machine)"
        in markdown
    )
    # rounds.png: beside loss by round, each site's global loss against the federation's node-hours so far
    from supertune.federation.config.load import load_federation
    from supertune.federation.reports.table import loss_figure
    from supertune.federation.state.layout import FederationDir

    figure = loss_figure(load_federation(str(failing))[0], FederationDir(failing))
    by_round, spent = figure.axes
    assert spent.get_xlabel().startswith("node-hours spent by the federation")
    through = np.cumsum([0.0] + [sum(r["node_hours"] for r in rows.values() if r["round"] == n) for n in (1, 2, 3)])
    base = table["base"]
    for site, line in zip(("site-a", "site-b"), spent.get_lines(), strict=True):
        rounds = [0] + [n for n in (1, 2, 3) if rows[n, site]["global"] is not None]  # site-b: not in round 2
        assert list(line.get_xdata()) == pytest.approx([through[n] for n in rounds])
        assert list(line.get_ydata()) == [base[site]] + [rows[n, site]["global"] for n in rounds[1:]]
    assert [len(line.get_xdata()) for line in by_round.get_lines()] == [4, 3, 3, 2]  # global and local, by round
    import matplotlib.pyplot as plt

    plt.close(figure)
    with (failing / "rounds.png").open("rb") as png:  # the two panels side by side: 12 x 4.5 inches at 110 dpi
        assert struct.unpack(">II", png.read(24)[16:24]) == (1320, 495)


@pytest.mark.slow
def test_a_federation_killed_after_leaving_a_site_out_resumes_to_the_same_global_model(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The copy stands where the federation stood after round 2's training and its decision to leave
    site-b out; killed (SIGKILL) in the middle of the average, then run again: the decision is kept
    (nothing trains) and round 2's global model is the uninterrupted one, byte for byte."""
    copy = tmp_path / "fed"
    copy_before_average(failing, copy, 2)
    _same_round_after_a_kill_in_its_average(failing, copy, 2, caplog)


@pytest.mark.slow
def test_a_federation_killed_between_two_left_out_receipts_decides_the_same_and_reaches_the_same_global_model(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 2 with a third site, site-c (from round 2, on site-b's data), begun 3 h ago under the 2 h
    deadline: site-a trained in time (the reference's run), site-b and site-c never started and are left
    out. Killed (SIGKILL) after site-b's left_out receipt and before site-c's, then run again: site-b's
    receipt is kept as it was, site-c is decided the same from the same start, and round 2's global
    model is the uninterrupted federation's (site-a's alone), byte for byte."""
    copy = tmp_path / "fed"
    copy_before_average(failing, copy, 2)
    shutil.rmtree(copy / "round-002" / "site-b")  # not trained yet
    config = yaml.safe_load((copy / "federation.yaml").read_text())
    config["sites"].append({**config["sites"][1], "name": "site-c", "from_round": 2})
    (copy / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    shutil.copytree(copy / "round-000" / "site-b", copy / "round-000" / "site-c")  # site-b's data: its base loss
    started = {"round": 2, "unix": time.time() - 3 * 3600, "deadline_s": 7200.0}
    (copy / "round-002" / "started.json").write_text(json.dumps(started), encoding="utf-8")
    killed = federate_cli(str(copy), env={"SUPERTUNE_FAULT": "federation.left_out@1"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    receipts = {name: copy / "round-002" / name / "left_out.json" for name in ("site-b", "site-c")}
    assert receipts["site-b"].exists() and not receipts["site-c"].exists()
    first = json.loads(receipts["site-b"].read_text())
    assert "training here" not in _in_process(caplog, copy)
    left = {name: json.loads(path.read_text()) for name, path in receipts.items()}
    reason = "late: not started after 2h (the sites on this machine train one after another)"
    assert left["site-b"] == first and [(r["reason"], r["attempts"]) for r in left.values()] == [(reason, 0)] * 2
    assert json.loads((copy / "round-002" / "started.json").read_text()) == started
    averaged = json.loads((copy / "round-002" / "averaged.json").read_text())
    assert averaged["weights"] == {"site-a": 1.0} and averaged["left_out"] == {"site-b": reason, "site-c": reason}
    _same_global_model(failing, copy, 2)


@pytest.mark.slow
def test_a_federation_killed_in_training_and_in_evaluation_under_a_deadline_keeps_its_start(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 2 again from round 1's global model under the 2 h deadline, site-b left out (--skip-site):
    the federation is killed (SIGKILL) while site-a trains, run again and killed in site-a's evaluation
    of the new global model (after its first batch, before its receipt), then run once more. The round
    keeps the start it had (started.json: the same deadline), decides the same, and its global model and
    site-a's loss under it are the uninterrupted federation's (site-a averaged alone there too)."""
    copy = tmp_path / "fed"
    copy_before_average(failing, copy, 2)
    shutil.rmtree(copy / "round-002")  # as it stood after round 1
    rd = copy / "round-002"
    worker = str(rd / "site-a" / "run")
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen([sys.executable, "-m", "supertune", "federate", str(copy), "--skip-site", "site-b"],
                                 stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            while not _processes(worker) and first.poll() is None:  # site-a's training process
                time.sleep(0.1)
            first.kill()  # SIGKILL
        finally:
            first.wait(60)
    assert first.returncode == -9, (tmp_path / "first.log").read_text()[-3000:]
    started = json.loads((rd / "started.json").read_text())
    assert not (rd / "site-a" / "trained.json").exists()
    for _ in range(100):  # its training dies with it (PR_SET_PDEATHSIG)
        if not _processes(worker):
            break
        time.sleep(0.1)
    assert not _processes(worker)
    killed = federate_cli(str(copy), env={"SUPERTUNE_FAULT": "evaluate.batch@1", "SUPERTUNE_FAULT_IN": " federate "})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (rd / "global").is_dir() and not (rd / "site-a" / "evaluated.json").exists()
    assert json.loads((rd / "started.json").read_text()) == started
    assert "training here" not in _in_process(caplog, copy)
    averaged = json.loads((rd / "averaged.json").read_text())
    assert averaged["weights"] == {"site-a": 1.0} and averaged["left_out"] == {"site-b": "skipped: --skip-site"}
    _same_global_model(failing, copy, 2)
    want, got = (json.loads((d / "round-002" / "site-a" / "evaluated.json").read_text()) for d in (failing, copy))
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], abs=1e-6) and got["model"] == str(rd / "global")


def _processes(marker: str) -> list[Path]:
    """The processes whose command line holds `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent)
        except OSError:  # ended meanwhile
            continue
    return found


def _same_global_model(reference: Path, copy: Path, number: int) -> None:
    """Round `number`'s global model in `copy` is `reference`'s, file for file and byte for byte."""
    rd = f"round-{number:03d}"
    files = sorted(f.name for f in (reference / rd / "global").glob("*.safetensors"))
    assert files and sorted(f.name for f in (copy / rd / "global").glob("*.safetensors")) == files
    assert all((reference / rd / "global" / f).read_bytes() == (copy / rd / "global" / f).read_bytes() for f in files)


def _in_process(caplog: pytest.LogCaptureFixture, directory: Path, **options) -> str:
    """`supertune federate DIR` run by its own code in this process (the later commands of a test: no
    start of torch each); what it logged."""
    from supertune.federation import federate

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="supertune"):
        federate(str(directory), None, **options)
    return caplog.text


def _same_round_after_a_kill_in_its_average(
    reference: Path, copy: Path, number: int, caplog: pytest.LogCaptureFixture, *args: str
) -> None:
    """`copy` stands before round `number`'s average: run (with `args`) and killed with SIGKILL in the
    middle of the average, then run again without them, it trains nothing, keeps the round's decisions
    (its left_out receipts, the weights and left_out of averaged.json) and writes the global model of
    the uninterrupted `reference`, file for file and byte for byte."""
    rd = f"round-{number:03d}"
    killed = federate_cli(str(copy), *args, env={"SUPERTUNE_FAULT": "average.tensor@2"})
    assert killed.returncode == -9 and not (copy / rd / "global").exists(), killed.stderr[-3000:]
    assert "training here" not in _in_process(caplog, copy)
    decided = sorted((reference / rd).glob("*/left_out.json"))
    assert decided and sorted((copy / rd).glob("*/left_out.json")) == [copy / p.relative_to(reference) for p in decided]
    for left in decided:
        want, got = (json.loads(f.read_text()) for f in (left, copy / left.relative_to(reference)))
        assert {k: got[k] for k in ("site", "round", "reason", "attempts")} == {
            k: want[k] for k in ("site", "round", "reason", "attempts")}  # fmt: skip
    want, got = (json.loads((d / rd / "averaged.json").read_text()) for d in (reference, copy))
    assert (got["weights"], got["left_out"]) == (want["weights"], want["left_out"])
    _same_global_model(reference, copy, number)


def _round_one_without(failing: Path, target: Path, site: str, **settings) -> None:
    """A copy through round 1's training in which `site` has not trained yet, with other settings."""
    aggregation = settings.pop("aggregation", {})
    copy_through_round_one_training(failing, target, aggregation)
    shutil.rmtree(target / "round-001" / site)
    (target / "round-001" / "started.json").unlink()  # the source's round 1 began minutes ago
    for later in ("round-002", "round-003"):
        shutil.rmtree(target / later, ignore_errors=True)
    config = yaml.safe_load((target / "federation.yaml").read_text())
    config.update(settings)
    (target / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


@pytest.mark.slow
def test_a_site_still_training_at_the_deadline_is_ended_and_the_round_goes_on(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = tmp_path / "fed"
    # site-b trains for a very long time (100000 steps) in a round whose deadline is 10 s away.
    sites = yaml.safe_load((failing / "federation.yaml").read_text())["sites"]
    sites[1]["steps_per_round"] = 100000
    sites[1]["overrides"].append("launch.nproc=2")  # torchrun and 2 workers: its node-hours count 2 processes
    _round_one_without(failing, copy, "site-b", round_deadline="10s", sites=sites, aggregation={"min_sites": 1})
    (copy / "sites" / "site-b.yaml").unlink()  # resolved again with its 100000 steps
    assert "site-b round 1: late: running after 10s; its processes were ended" in _in_process(caplog, copy)
    left = json.loads((copy / "round-001" / "site-b" / "left_out.json").read_text())
    assert left["reason"] == "late: running after 10s" and left["attempts"] == 1
    assert json.loads((copy / "round-001" / "averaged.json").read_text())["weights"] == {"site-a": 1.0}
    [attempt] = json.loads((copy / "round-001" / "site-b" / "cost.json").read_text())["attempts"]
    assert attempt["outcome"] == "late: running after 10s" and attempt["end"] > attempt["start"]
    assert attempt["processes"] == 2
    rows = {r["site"]: r for r in json.loads((copy / "rounds.json").read_text())["rows"]}
    assert rows["site-b"]["node_hours"] == pytest.approx(2 * (attempt["end"] - attempt["start"]) / 3600)
    run = str(copy / "round-001" / "site-b" / "run")
    time.sleep(0.5)
    alive = [p for p in Path("/proc").glob("[0-9]*/cmdline") if run in p.read_bytes().decode(errors="replace")]
    assert not alive  # the late site's processes (torchrun's workers too) are gone, not left to burn node-hours
    # Killed in the average after that decision, resumed: the same decision and global model.
    copy_before_average(copy, tmp_path / "killed", 1)
    _same_round_after_a_kill_in_its_average(copy, tmp_path / "killed", 1, caplog)


@pytest.mark.slow
def test_a_round_below_its_quorum_at_the_deadline_stops_and_skip_site_goes_on(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = tmp_path / "fed"
    _round_one_without(failing, copy, "site-b", round_deadline="1h", aggregation={"min_sites": None})  # every site
    started = copy / "round-001" / "started.json"
    started.write_text(json.dumps({"round": 1, "unix": time.time() - 7200}))  # the round began 2 h ago
    from supertune.errors import UserError
    from supertune.federation import federate

    with pytest.raises(UserError) as stopped:  # the command's one-line error, its code run in this process
        federate(str(copy), None)
    assert str(stopped.value) == (
        "round 1: 1 of 2 sites finished training by its deadline (round_deadline 1h) and the "
        "round needs every site (aggregation.min_sites empty); site-b: late: not started after 1h (the sites on this "
        f"machine train one after another) (0 attempts); run `supertune federate {copy}` again to go on (each "
        "unfinished site resumes from its latest checkpoint, with a new deadline), or leave a site out of this round "
        f"with `supertune federate {copy} --skip-site NAME` (for good: --drop NAME)"
    )
    assert (
        not started.exists() and not list(copy.rglob("left_out.json")) and not (copy / "round-001" / "global").exists()
    )
    stopped_copy = tmp_path / "killed"  # the stopped federation, to go on from again with a kill on the way
    shutil.copytree(copy, stopped_copy)
    rehome_receipts(copy, stopped_copy)
    with pytest.raises(UserError) as refused:
        federate(str(copy), None, skip=["site-c"])
    assert str(refused.value) == "--skip-site: 'site-c' is not a site of this federation; its sites are site-a, site-b"
    assert "training here" not in _in_process(caplog, copy, skip=["site-b"])
    left = json.loads((copy / "round-001" / "site-b" / "left_out.json").read_text())
    assert left["reason"] == "skipped: --skip-site" and left["attempts"] == 0
    assert json.loads((copy / "round-001" / "averaged.json").read_text())["weights"] == {"site-a": 1.0}
    assert "| 1 | site-b | - |" in (copy / "rounds.md").read_text()
    # --skip-site killed in the average after writing its receipt; `supertune federate DIR` alone then
    # keeps the skip and reaches the same global model.
    _same_round_after_a_kill_in_its_average(copy, stopped_copy, 1, caplog, "--skip-site", "site-b")


@pytest.mark.slow
def test_the_cost_plan_counts_the_model_and_measures_node_hours_from_the_rounds_run(
    failing: Path, tmp_path: Path
) -> None:
    from supertune.federation import federation_cost_plan

    def rows(text: str) -> dict[tuple[int, str], list[str]]:
        cells = [
            line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ") and "---" not in line
        ]
        return {(int(c[0]), c[1].strip()): [x.strip() for x in c[2:]] for c in cells[1:]}

    # A new federation: the model counted on the meta device is the base model's file but for its header.
    fresh = federation_cost_plan(str(failing.parent / "federation.yaml"), str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
    weights = (failing / "round-000" / "global" / "model.safetensors").stat().st_size
    counted = int(fresh.split("the model's weights, ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < weights - counted < 20_000
    planned = rows(fresh)
    assert len(planned) == 6 and planned[1, "site-a"][:3] == ["1", "2", "-"]
    assert "(without site-a, site-b: no round of theirs to measure yet)" in fresh
    # After round 1's training: rounds 1-3 to run, each site's node-hours per step from round 1.
    copy = tmp_path / "fed"
    copy_through_round_one_training(failing, copy, {})
    config = yaml.safe_load((copy / "federation.yaml").read_text())
    config["rounds"] = 3
    (copy / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    measured = federation_cost_plan(str(copy), None)
    assert "rounds 1-3 of 3 to run" in measured and "(the files of" in measured
    spent = json.loads((copy / "round-001" / "site-b" / "cost.json").read_text())["attempts"]
    node_hours = sum(a["nodes"] * (a["end"] - a["start"]) for a in spent) / 3600
    planned = rows(measured)
    assert float(planned[3, "site-b"][2]) == pytest.approx(node_hours, abs=1e-4)
    assert planned[3, "site-b"][3] == planned[3, "site-b"][4] == f"{weights / 1e6:.2f}"


@pytest.mark.slow
def test_a_checkpoint_that_no_longer_matches_its_manifest_is_refused_and_left_out(
    failing: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """site-b's finished round-1 checkpoint changed on disk before its receipt was written: each attempt
    finds the run finished, refuses the checkpoint, and the round is averaged without the site."""
    copy = tmp_path / "fed"
    copy_through_round_one_training(failing, copy, {"min_sites": 1})
    (copy / "round-001" / "site-b" / "trained.json").unlink()
    [weights] = (copy / "round-001" / "site-b" / "run" / "checkpoints").glob("checkpoint-*/model.safetensors")
    with weights.open("r+b") as f:  # one byte of a tensor flipped: same size, another sha256
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    _in_process(caplog, copy)
    left = json.loads((copy / "round-001" / "site-b" / "left_out.json").read_text())
    assert left["reason"].startswith("refused: ") and "does not match its manifest" in left["reason"], left
    assert left["attempts"] == 2
    assert json.loads((copy / "round-001" / "averaged.json").read_text())["weights"] == {"site-a": 1.0}
