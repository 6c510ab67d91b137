"""Federated rounds through StreamFlow (`executor: streamflow`), with the real `streamflow run`
(0.2.0rc3, from .venv-streamflow, which scripts/env.sh makes):

- two `local` deployments reach the same global model as the built-in executor on the same
  federation, through a round whose average is killed: it fails with one line naming the round and
  StreamFlow's log, leaves no process behind, and the same command runs what is left of it (one
  federation for both claims: its sites' training and the base's evaluation run once, not twice);
  a finished federation run again starts no StreamFlow;
- a site on the real Slurm test cluster through StreamFlow's `slurm` deployment (sbatch run here):
  its training and evaluation run in the jobs StreamFlow submitted, with supertune's job scripts,
  and its training job's Slurm times are its cost (found by the job's name);
- a quorum with a retry: a site whose training ends in a NaN at every attempt is left out and the
  round goes on, every attempt costed; a site still training at the round's deadline is ended and
  left out;
- the generated streamflow.yml of a site behind a login node (slurm wrapping ssh), and the checks
  of the StreamFlow-only keys, without running anything;
- `federate --dry-run` prints round 1's StreamFlow files with the federation directory's paths, and
  writes nothing.

Not run here: a real SSH login node (see docs/tutorials/federated-streamflow.md).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from cluster.slurm_cluster import SlurmCluster
from supertune.errors import UserError
from supertune.federation.config.default import site_corpus
from supertune.federation.config.schema import FederationConfig, StreamFlowConfig

SITE = ["generate.max_new_tokens=0", "training.report_to=[]", "training.logging_steps=2", "data.max_eval_samples=16"]
STEPS = 4


@pytest.fixture(scope="module")
def streamflow() -> str:
    """The streamflow executable the federation finds; missing it fails with CI set, else skips."""
    from supertune.federation.executors.streamflow.executor import streamflow_command

    try:
        return streamflow_command(FederationConfig())
    except UserError as exc:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"StreamFlow unavailable with CI set: {exc}", pytrace=False)
        pytest.skip(f"StreamFlow unavailable: {exc}")


def _federation(path: Path, executor: str, where: dict[str, str] | None = None, **extra) -> Path:
    sites = []
    for name, corpus in (("here", "site-a"), ("there", "site-b")):
        train, validation = site_corpus(corpus)
        sites.append({"name": name, "where": (where or {}).get(name, "local"), "steps_per_round": STEPS,
                      "overrides": [f"data.train_files={train}", f"data.validation_files={validation}", *SITE]})  # fmt: skip
    config = {"name": "fed-sf", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "executor": executor,
              "poll_seconds": 1, "streamflow": {"polling_seconds": 1}, "sites": sites, **extra}  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    file = path / f"federation-{executor}.yaml"
    file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return file


def _federate(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supertune", "federate", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _global(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted((directory / "round-001" / "global").glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def _receipts(directory: Path) -> dict[str, dict]:
    return {str(p.relative_to(directory)): json.loads(p.read_text()) for p in sorted(directory.glob("round-*/**/*.json"))
            if p.name in ("trained.json", "averaged.json", "evaluated.json")}  # fmt: skip


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in words and str(os.getpid()) != cmdline.parent.name:
            found.append(words)
    return found


@pytest.fixture(scope="module")
def builtin_round(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same federation (one round, two local sites) run by the built-in executor."""
    root = tmp_path_factory.mktemp("builtin")
    proc = _federate(str(_federation(root, "builtin")), "--dir", str(root / "fed"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "fed"


@pytest.mark.slow
def test_two_local_deployments_average_as_the_builtin_executor_and_finish_a_round_whose_average_was_killed(
    streamflow: str, builtin_round: Path, tmp_path: Path
) -> None:
    """One federation through StreamFlow, its average killed in the first attempt: the round fails in
    one line, the same command runs what is left of it, and the result is the built-in executor's
    (global model, every receipt); run once more, it starts no StreamFlow."""
    fed_dir = tmp_path / "fed"
    sf = fed_dir / "streamflow" / "round-001"
    env = dict(os.environ, SUPERTUNE_FAULT="average.tensor@3")  # the average step kills itself after 3 tensors
    failed = _federate(str(_federation(tmp_path, "streamflow")), "--dir", str(fed_dir), env=env)
    assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
    [line] = [x for x in failed.stderr.splitlines() if x.startswith("supertune: error:")]
    assert "round 1: streamflow run failed" in line and "Traceback" not in failed.stderr
    assert str(sf / "streamflow.log") in failed.stderr
    assert not (fed_dir / "round-001" / "averaged.json").exists() and not (fed_dir / "round-001" / "global").exists()
    assert _processes_mentioning(str(fed_dir)) == []  # StreamFlow's steps ended with it
    # The sites' finished runs are recorded although the round failed: they are not run again.
    assert {p.parent.name for p in (fed_dir / "round-001").glob("*/trained.json")} == {"here", "there"}
    # What StreamFlow ran: one workflow per round, explicit steps, each site its own deployment.
    workflow = yaml.safe_load((sf / "round.cwl").read_text())
    assert list(workflow["steps"]) == ["train_here", "train_there", "average", "evaluate_here", "evaluate_there"]
    config = yaml.safe_load((sf / "streamflow.yml").read_text())
    assert {name: d["type"] for name, d in config["deployments"].items()} == {
        "federation": "local",
        "site.here": "local",
        "site.there": "local",
    }
    assert config["database"]["config"]["connection"] == str(sf / "streamflow.db") and (sf / "streamflow.db").is_file()
    first_log = (sf / "streamflow.log").stat().st_size

    resumed = _federate(str(fed_dir))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert list(yaml.safe_load((sf / "round.cwl").read_text())["steps"]) == [
        "average",
        "evaluate_here",
        "evaluate_there",
    ]
    job = yaml.safe_load((sf / "job.yml").read_text())
    assert job["checkpoint_here"]["path"] == str(fed_dir / "round-001/here/run/checkpoints/checkpoint-4")
    assert sorted(p.name for p in (sf / "out").iterdir()) == [
        "averaged.json",
        "evaluated-here.json",
        "evaluated-there.json",
    ]
    assert "Traceback" not in (sf / "streamflow.log").read_text()[first_log:]
    assert _max_difference(_global(fed_dir), _global(builtin_round)) <= 1e-6

    # Every receipt the built-in executor writes, with the same counts.
    ours, theirs = _receipts(fed_dir), _receipts(builtin_round)
    assert (
        ours.keys() == theirs.keys() and len(ours) == 7
    )  # 2 evaluations of the base; 2 trainings, 1 average, 2 evaluations
    for key in ours:
        for field in ("tokens", "step", "samples", "weights", "round", "site"):
            assert ours[key].get(field) == theirs[key].get(field), (key, field)
    assert ours["round-001/here/trained.json"]["checkpoint"] == str(
        fed_dir / "round-001/here/run/checkpoints/checkpoint-4"
    )
    assert ours["round-001/there/evaluated.json"]["model"] == str(fed_dir / "round-001/global")
    assert (
        abs(ours["round-001/there/evaluated.json"]["eval_loss"] - theirs["round-001/there/evaluated.json"]["eval_loss"])
        < 1e-4
    )

    again = _federate(str(fed_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "streamflow run" not in again.stderr and _receipts(fed_dir) == ours


def test_a_federation_killed_during_streamflow_leaves_its_steps_to_be_ended_by_the_next_attempt(tmp_path: Path) -> None:
    """run_group_logged / end_group: a SIGKILL of the process that ran StreamFlow kills StreamFlow
    (PDEATHSIG), not its steps; the next attempt finds them by the group and ends them."""
    marker = str(tmp_path / "marker-dir")
    group = tmp_path / "group"
    code = (
        "import sys; from pathlib import Path; from supertune.subprocesses import run_group_logged\n"
        # As StreamFlow's steps: a shell in the group whose command line names the federation's folder.
        f"run_group_logged(['sh', '-c', 'sh -c \"sleep 300; : {marker}\" & sleep 301'], Path({str(tmp_path / 'log')!r}), Path({str(group)!r}))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (group.is_file() and len(_processes_mentioning("sleep 30")) >= 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    pgid = int(group.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(0.5)
    assert _group_members(pgid), "the steps outlive the killed parent (that is what end_group is for)"
    from supertune.subprocesses import end_group

    assert end_group(group, marker, grace=10)
    assert _group_members(pgid) == [] and not group.exists()
    assert not end_group(group, marker)  # nothing recorded any more


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_a_step_that_reported_success_without_its_output_fails_the_round(tmp_path: Path) -> None:
    """A SLURM job cancelled with scancel ends with exit code 0:15, which StreamFlow takes for a
    success: the executor reads every output itself. What is there is recorded, the rest is an error."""
    from supertune.federation.config.schema import SiteConfig
    from supertune.federation.executors.streamflow.cwl import RoundFiles
    from supertune.federation.executors.streamflow.executor import StreamFlowExecutor
    from supertune.federation.rounds.loop import RoundWork, SiteWork
    from supertune.federation.state.layout import FederationDir

    sites = [SiteConfig(name="a"), SiteConfig(name="b")]
    root = FederationDir(tmp_path / "fed")
    rd = root.round(1)
    evaluate = [
        SiteWork(s, 1, tmp_path / "site.yaml", rd.site(s.name).path, receipt=rd.site(s.name).evaluated) for s in sites
    ]
    work = RoundWork(1, root.round(0).global_model, rd.global_model, rd.averaged, evaluate=evaluate)
    files = RoundFiles(root.streamflow / "round-001")
    files.outdir.mkdir(parents=True)
    (files.outdir / "evaluated-a.json").write_text(
        json.dumps({"eval_loss": 3.25, "model": "/staged/copy"}), encoding="utf-8"
    )
    executor = StreamFlowExecutor(FederationConfig(name="f", executor="streamflow", sites=sites), root)
    with pytest.raises(
        UserError, match="b round 1: evaluation: StreamFlow reported success but left no evaluated-b.json"
    ):
        executor._record(work, files, {})
    assert json.loads(rd.site("a").evaluated.read_text()) == {"eval_loss": 3.25, "model": str(rd.global_model)}
    assert not rd.site("b").evaluated.exists()


def test_the_streamflow_keys_are_checked_all_at_once(tmp_path: Path) -> None:
    config = yaml.safe_load(_federation(tmp_path, "streamflow").read_text())
    config["streamflow"]["ssh_key"] = str(tmp_path / "no-key")
    config["sites"][0].update(login="me@login.example.org:99999", workdir="relative/dir", python="/opt/py thon")
    config["sites"][1].update(login="login.example.org", where="local")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = _federate(str(path), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    for expected in (
        "sites[0] (here).login: 'me@login.example.org:99999' is not [user@]host[:port]",
        "sites[0] (here).workdir: 'relative/dir' must be an absolute path",
        "sites[0] (here).python: '/opt/py thon' must be an absolute path",
        "sites[1] (there).where: a site reached over SSH trains through its SLURM",
        "sites[1] (there).workdir: a site reached over SSH needs a directory there",
        "sites[1] (there).python: a site reached over SSH needs the path of its Python",
        "streamflow.ssh_key:",
    ):
        assert expected in proc.stderr, (expected, proc.stderr)
    config["executor"] = "builtin"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert "sites[0] (here).python: only used with executor: streamflow" in _federate(str(path), timeout=120).stderr


def test_a_site_behind_a_login_node_is_slurm_wrapping_ssh() -> None:
    from supertune.federation.executors.streamflow.cwl import RoundFiles, SitePlace, streamflow_config
    from supertune.federation.rounds.loop import RoundWork

    fed = FederationConfig(
        name="llama", streamflow=StreamFlowConfig(ssh_key="/home/me/.ssh/id_ed25519", polling_seconds=30)
    )
    service = {"jobName": "llama-r002-leonardo-train", "nodes": "2", "ntasksPerNode": 4, "cpusPerTask": 8, "gpusPerNode": "4",
               "partition": "boost_usr_prod", "account": "EUHPC_X", "time": "04:00:00"}  # fmt: skip
    place = SitePlace("leonardo", "/scratch/me/fed/llama/round-002/leonardo", "/scratch/me/venv/bin/python", {},
                      login="me@login.leonardo.cineca.it:2222", workdir="/scratch/me/fed/llama/streamflow/round-002/leonardo",
                      services={"train": service, "evaluate": service})  # fmt: skip
    work = RoundWork(2, Path("/f/round-001/global"), Path("/f/round-002/global"), Path("/f/round-002/averaged.json"))
    config = streamflow_config(fed, work, {"leonardo": place}, RoundFiles(Path("/f/streamflow/round-002")),
                               ["train_leonardo", "average", "evaluate_leonardo"])  # fmt: skip
    d = config["deployments"]
    assert d["login.leonardo"] == {
        "type": "ssh",
        "config": {
            "nodes": ["login.leonardo.cineca.it:2222"],
            "checkHostKey": True,
            "username": "me",
            "sshKey": "/home/me/.ssh/id_ed25519",
        },
        "workdir": place.workdir,
    }
    assert d["site.leonardo"]["type"] == "slurm" and d["site.leonardo"]["wraps"] == "login.leonardo"
    assert (
        d["site.leonardo"]["config"]["services"]["train"] == service
        and d["site.leonardo"]["config"]["pollingInterval"] == 30
    )
    assert d["federation"]["workdir"] == "/f/streamflow/round-002/work/federation"
    assert config["workflows"]["round-002"]["bindings"] == [
        {"step": "/train_leonardo", "target": {"deployment": "site.leonardo", "service": "train"}},
        {"step": "/evaluate_leonardo", "target": {"deployment": "site.leonardo", "service": "evaluate"}},
        {"step": "/average", "target": {"deployment": "federation"}},
    ]


@pytest.mark.slow
def test_a_site_on_the_test_cluster_through_streamflows_slurm_deployment(
    streamflow: str, slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    # `where: local` is "this machine" in a federation: the test cluster gets a profile of its own name.
    profiles = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters"
    profiles.mkdir(parents=True)
    (profiles / "testcluster.yaml").write_text(
        "description: the Slurm test cluster\ncpus_per_node: 2\n", encoding="utf-8"
    )
    fed_dir = tmp_path / "fed"
    config = _federation(tmp_path, "streamflow", where={"there": "testcluster"})
    proc = _federate(str(config), "--dir", str(fed_dir), env=slurm_client)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    sf = fed_dir / "streamflow" / "round-001"
    deployments = yaml.safe_load((sf / "streamflow.yml").read_text())["deployments"]
    assert deployments["site.here"]["type"] == "local" and deployments["site.there"]["type"] == "slurm"
    assert "wraps" not in deployments["site.there"]
    train = deployments["site.there"]["config"]["services"]["train"]
    assert train == {
        "jobName": "fed-sf-r001-there-train",
        "nodes": "1",
        "ntasksPerNode": 1,
        "cpusPerTask": 2,
        "time": "01:00:00",
    }
    log = (sf / "streamflow.log").read_text()
    assert "Scheduled job" in log  # StreamFlow submitted the site's steps with sbatch

    site = fed_dir / "round-001" / "there"
    trained = json.loads((site / "trained.json").read_text())
    assert trained["step"] == STEPS and trained["tokens"] == STEPS * 16 * 128
    run = Path(trained["run"])
    assert run == site / "run" and (run / "job.sbatch").is_file()
    assert "supertune: job " in (site / "train.log").read_text()  # the job script ran inside StreamFlow's allocation
    assert (site / "evaluate" / "job.sbatch").is_file()
    evaluated = json.loads((site / "evaluated.json").read_text())
    base = json.loads((fed_dir / "round-000" / "there" / "evaluated.json").read_text())
    assert evaluated["eval_loss"] < base["eval_loss"]
    squeue = slurm_single.run("squeue", "--noheader", "--format=%j", check=False).stdout
    assert "fed-sf" not in squeue  # no job left behind
    # Its training's cost: the job StreamFlow submitted under the name supertune gave it, with Slurm's own
    # times as the controller reports them (no accounting database here: scontrol keeps finished jobs).
    [attempt] = json.loads((site / "cost.json").read_text())["attempts"]
    shown = slurm_single.run("scontrol", "--oneliner", "show", "job", attempt["job"]).stdout
    fields = dict(part.split("=", 1) for part in shown.split() if "=" in part)
    assert fields["JobName"] == "fed-sf-r001-there-train" and fields["JobState"] == "COMPLETED", shown
    for key, name in (("submit", "SubmitTime"), ("start", "StartTime"), ("end", "EndTime")):
        assert attempt[key] == datetime.datetime.fromisoformat(fields[name]).timestamp(), (key, shown)
    assert attempt["nodes"] == int(fields["NumNodes"]) == 1 and attempt["outcome"] == "finished"
    [here] = json.loads((fed_dir / "round-001" / "here" / "cost.json").read_text())["attempts"]
    assert here["outcome"] == "finished" and here["processes"] == 1 and here["job"] is None
    rows = {r["site"]: r for r in json.loads((fed_dir / "rounds.json").read_text())["rows"]}
    assert rows["there"]["node_hours"] == pytest.approx((attempt["end"] - attempt["start"]) / 3600)
    assert rows["there"]["queue_s"] == pytest.approx(attempt["start"] - attempt["submit"])
    assert rows["here"]["node_hours"] == pytest.approx((here["end"] - here["start"]) / 3600)
    assert rows["there"]["attempts"] == rows["here"]["attempts"] == 1


def test_a_site_behind_a_login_node_has_its_files_checked_there_and_an_unreachable_one_is_named(
    streamflow: str, tmp_path: Path
) -> None:
    """Data and tokenizer paths that exist only at the site are not looked for on this machine; the
    first thing that fails is the login to the site, and the error names the site and its host."""
    (tmp_path / "remote.yaml").write_text(
        "data: {train_files: /site-only/corpus/*.jsonl, validation_files: /site-only/valid.jsonl}\n"
        "model: {tokenizer: /site-only/tokenizer}\n",
        encoding="utf-8",
    )
    config = yaml.safe_load(_federation(tmp_path, "streamflow").read_text())
    config["sites"][1].update(config="remote.yaml", overrides=SITE, where="leonardo", login="me@login.site-b.invalid",
                              workdir="/scratch/me/fed", python="/scratch/me/venv/bin/python")  # fmt: skip
    path = tmp_path / "remote-fed.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = _federate(str(path), "--dir", str(tmp_path / "fed"), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("supertune: error:")]
    assert "site there: login node me@login.site-b.invalid cannot be used over SSH" in line, line
    assert "/site-only" not in proc.stderr and not (tmp_path / "fed" / "streamflow").exists()  # StreamFlow never ran


def test_the_site_check_refuses_what_is_missing_at_the_site_naming_it(tmp_path: Path) -> None:
    """`site-task check`, what the federation runs over SSH at a site with login before its first
    round: the site's resolved config on stdin, checked where the files are (here, in this test)."""
    from supertune.entry import SITE_TASK, entry_words

    config = "data: {train_files: [/site-only/train.jsonl]}\nmodel: {name_or_path: /coordinator/only/base, tokenizer: /site-only/tok}\n"
    proc = subprocess.run([sys.executable, *map(str, entry_words(SITE_TASK, ["check", "--site", "leonardo"]))],
                          input=config, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "site leonardo: model.tokenizer: directory '/site-only/tok' does not exist" in proc.stderr
    assert "site leonardo: data.train_files: file '/site-only/train.jsonl' does not exist" in proc.stderr
    assert "/coordinator/only/base" not in proc.stderr  # the global model is staged at the site by each round


def test_a_site_folder_of_another_federation_is_refused_not_reused(tmp_path: Path) -> None:
    """Two federations with one name and workdir share `<workdir>/<name>/round-NNN/<site>/`: the
    train step of the second refuses the first one's folder (its run may be finished) before
    anything in it is read or written; the first federation's next attempt goes on there."""
    from supertune.entry import SITE_TASK, entry_words

    site_dir = tmp_path / "workdir" / "fed-sf" / "round-001" / "there"
    config = tmp_path / "site.yaml"
    config.write_text("training: {max_steps: 6}\n", encoding="utf-8")

    def train(federation: str, task: str = "train") -> subprocess.CompletedProcess[str]:
        model = ["--global-model" if task == "train" else "--model", str(tmp_path / "no-model")]
        args = [task, "--federation-id", federation, "--site", "there", "--round", "1", "--config", str(config),
                "--site-dir", str(site_dir), *model]  # fmt: skip
        return subprocess.run([sys.executable, *map(str, entry_words(SITE_TASK, args))], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)  # fmt: skip

    first = train("aaaa")  # claims the folder, then stops: its global model is missing
    assert first.returncode != 0 and json.loads((site_dir / "owner.json").read_text()) == {
        "federation": "aaaa", "site": "there", "round": 1}  # fmt: skip
    (site_dir / "run").mkdir(exist_ok=True)
    (site_dir / "run" / "summary.json").write_text("{}", encoding="utf-8")  # as if the first one had finished
    before = sorted(p.relative_to(site_dir) for p in site_dir.rglob("*"))

    second = train("bbbb")
    assert second.returncode == 2 and "Traceback" not in second.stderr
    [line] = [x for x in second.stderr.splitlines() if x.startswith("supertune: error:")]
    assert f"there round 1: {site_dir} belongs to federation aaaa (site there, round 1), not to this one (bbbb)" in line
    assert f"it is not reused; delete {site_dir}" in line
    evaluate = train("bbbb", task="evaluate")  # the evaluation step checks the same record
    assert evaluate.returncode == 2 and "belongs to federation aaaa" in evaluate.stderr
    assert sorted(p.relative_to(site_dir) for p in site_dir.rglob("*")) == before

    # A folder with a run and no record (a federation from before ids were kept) is refused too.
    (site_dir / "owner.json").unlink()
    legacy = train("aaaa")
    assert legacy.returncode == 2 and f"{site_dir} holds run" in legacy.stderr
    assert "that no federation recorded as its own" in legacy.stderr


def test_a_dry_run_prints_round_ones_streamflow_files_and_writes_nothing(
    streamflow: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    from supertune.cli.main import main

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where the files are made, then removed
    (tmp_path / "tmp").mkdir()
    config = tmp_path / "fed.yaml"
    config.write_text(
        "name: sf-plan\nrounds: 2\nexecutor: streamflow\n"
        f"streamflow: {{command: {streamflow}}}\n"
        "sites:\n  - {name: here, steps_per_round: 4, overrides: [training.warmup_steps=0]}\n"
        "  - {name: leo, where: leonardo, steps_per_round: 8, overrides: [training.warmup_steps=0, slurm.account=EUHPC_X]}\n"
    )
    fed_dir = tmp_path / "fed"
    assert main(["federate", str(config), "--dry-run", "--dir", str(fed_dir)]) == 0
    out = capsys.readouterr().out
    files = out.split("# ---- StreamFlow: ")[1:]
    round_files = fed_dir / "streamflow" / "round-001"
    names = [str(round_files / n) for n in ("round.cwl", "job.yml", "streamflow.yml")]
    assert [f.split(", as round 1 writes it\n")[0] for f in files] == names
    workflow, job, deployments = (yaml.safe_load(f.split("\n", 1)[1]) for f in files)
    assert sorted(workflow["steps"]) == ["average", "evaluate_here", "evaluate_leo", "train_here", "train_leo"]
    assert job["config_leo"]["path"] == str(fed_dir / "round-001" / "leo" / "site.yaml")
    assert job["previous"]["path"] == str(fed_dir / "round-000" / "global")
    leo = deployments["deployments"]["site.leo"]
    assert leo["type"] == "slurm" and leo["config"]["services"]["train"]["jobName"] == "sf-plan-r001-leo-train"
    assert "supertune-dry-run" not in out and not list((tmp_path / "tmp").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fed.yaml", "tmp"]


@pytest.fixture(scope="module")
def left_out(streamflow: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One round through StreamFlow with a quorum of 1 and one retry, where site `there` ends in a NaN
    loss at every attempt (training.learning_rate=1e30): its failures are reported by its train step,
    `here` trains on, and the round is averaged and evaluated without `there`."""
    root = tmp_path_factory.mktemp("sf-quorum")
    config = yaml.safe_load(_federation(root, "streamflow").read_text())
    config["sites"][1]["overrides"].append("training.learning_rate=1e30")
    config.update(site_retries=1, aggregation={"min_sites": 1})
    path = root / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    proc = _federate(str(path), "--dir", str(root / "fed"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "there round 1: attempt 1 of 2: failed: exit 2; trying again" in proc.stderr
    return root / "fed"


@pytest.mark.slow
def test_a_site_that_fails_every_attempt_is_left_out_and_every_attempt_is_costed(left_out: Path) -> None:
    rd = left_out / "round-001"
    left = json.loads((rd / "there" / "left_out.json").read_text())
    assert left["reason"] == "failed: exit 2" and left["attempts"] == 2
    averaged = json.loads((rd / "averaged.json").read_text())
    assert averaged["weights"] == {"here": 1.0} and averaged["left_out"] == {"there": "failed: exit 2"}
    assert (rd / "here" / "evaluated.json").is_file() and not (rd / "there" / "evaluated.json").exists()
    # The training workflows (one per attempt) had train steps only; the average and evaluation came after.
    workflow = yaml.safe_load((left_out / "streamflow" / "round-001" / "round.cwl").read_text())
    assert list(workflow["steps"]) == ["average", "evaluate_here"]
    assert workflow["steps"]["average"]["in"]["sites"] == {"default": ["here"]}
    # Each step recorded its own attempts: processes x its wall time, no queue.
    spent = {s: json.loads((rd / s / "cost.json").read_text())["attempts"] for s in ("here", "there")}
    assert [a["outcome"] for a in spent["there"]] == ["failed: exit 2"] * 2
    assert [a["outcome"] for a in spent["here"]] == ["finished"]
    trained = json.loads((rd / "here" / "trained.json").read_text())
    [attempt] = spent["here"]
    assert attempt["processes"] == 1 and attempt["end"] - attempt["start"] >= trained["seconds"]
    rows = {r["site"]: r for r in json.loads((left_out / "rounds.json").read_text())["rows"]}
    for site, attempts in spent.items():
        assert rows[site]["attempts"] == len(attempts) and rows[site]["queue_s"] == 0
        assert rows[site]["node_hours"] == pytest.approx(sum(a["end"] - a["start"] for a in attempts) / 3600)
    assert rows["there"]["left_out"] == "failed: exit 2" and rows["there"]["tokens"] is None


@pytest.mark.slow
def test_a_site_still_training_at_the_deadline_is_ended_and_left_out(left_out: Path, tmp_path: Path) -> None:
    """A copy of the federation after `here`'s training of round 1, where `there` now trains 100000
    steps within a 15 s round_deadline: its streamflow run is ended at the deadline, its step's
    processes with it, and the round goes on without it."""
    from federation_copies import copy_through_round_one_training

    copy = tmp_path / "fed"
    copy_through_round_one_training(left_out, copy, {"min_sites": 1})
    shutil.rmtree(copy / "round-001" / "there")
    shutil.rmtree(copy / "streamflow" / "round-001")
    (copy / "round-001" / "started.json").unlink(missing_ok=True)
    (copy / "sites" / "there.yaml").unlink()  # resolved again with its new steps
    config = yaml.safe_load((copy / "federation.yaml").read_text())
    config["round_deadline"], config["site_retries"] = "15s", 0
    there = config["sites"][1]
    there["steps_per_round"] = 100000
    there["overrides"] = [o for o in there["overrides"] if not o.startswith("training.learning_rate")]
    (copy / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    proc = _federate(str(copy))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rd = copy / "round-001"
    left = json.loads((rd / "there" / "left_out.json").read_text())
    assert left["reason"] == "late: running after 15s" and left["attempts"] == 1
    assert json.loads((rd / "averaged.json").read_text())["weights"] == {"here": 1.0}
    started = json.loads((rd / "started.json").read_text())["unix"]
    [attempt] = json.loads((rd / "there" / "cost.json").read_text())["attempts"]
    assert attempt["outcome"] == "late: running after 15s" and started < attempt["start"] < attempt["end"]
    assert attempt["end"] >= started + 15
    assert _processes_mentioning(str(rd / "there")) == []  # nothing of the late site runs on


def test_the_jobs_a_dropped_site_left_queued_are_cancelled_when_its_round_runs_again(
    tmp_path: Path, monkeypatch
) -> None:
    """A round's earlier attempt left site-b's SLURM jobs queued; site-b is then dropped (--drop), and the
    round runs again: its jobs are cancelled by name with the remaining sites' (Slurm's commands scripted).
    Before, only the sites still in the federation were looked for, and site-b's jobs waited in its queue."""
    from supertune.federation.config.load import federation_text, load_federation
    from supertune.federation.executors.streamflow.executor import StreamFlowExecutor
    from supertune.federation.rounds.loop import RoundWork
    from supertune.federation.state.history import active_federation, drop_sites
    from supertune.federation.state.layout import FederationDir

    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump({"name": "sf", "rounds": 2, "executor": "streamflow", "sites": [
        {"name": "a", "where": "leonardo"}, {"name": "b", "where": "leonardo", "login": "me@login.example.org",
                                             "workdir": "/scratch/me/fed", "python": "/opt/venv/bin/python"},
        {"name": "c"}]}))  # fmt: skip
    fed, _ = load_federation(config)
    root = FederationDir(tmp_path / "fed")
    root.path.mkdir()
    root.config.write_text(federation_text(fed))
    drop_sites(fed, root, ["b"])
    queued = {"sf-r001-b-train": ["41"], "sf-r001-b-evaluate": ["42"]}
    asked, cancelled = [], []
    monkeypatch.setattr(
        "supertune.slurm.commands.named_jobs", lambda name, via=(): asked.append(name) or queued.get(name, [])
    )
    monkeypatch.setattr(
        "supertune.slurm.commands.cancel_named", lambda name, via=(): cancelled.append((name, via[-2:]))
    )
    executor = StreamFlowExecutor(active_federation(fed, root), root)
    work = RoundWork(1, tmp_path / "g0", tmp_path / "g1", root.round(1).averaged)
    assert executor._cancel_jobs(work, {}, wait=False) == ""
    assert asked == ["sf-r001-b-train", "sf-r001-b-evaluate"]
    assert [name for name, _ in cancelled] == ["sf-r001-b-train", "sf-r001-b-evaluate"]
    assert all("me@login.example.org" in via for _, via in cancelled)  # over ssh to its login node
