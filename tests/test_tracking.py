"""Experiment tracking against the real backends: a real MLflow tracking server on a loopback port
(real HTTP, SQLite backend store), read back through MLflow's client; W&B in offline mode, its run
files read back by W&B's own reader (`wandb leet inspect --json`). One short training, killed and
resumed, serves most assertions: one supertune run must stay one tracked run."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from supertune.config import RunConfig
from supertune.launch.environment import LaunchEnvironment
from supertune.rundir import RunDir
from supertune.tracking import offline_wandb_runs, read_ids
from supertune.tracking.session import Tracking

pytestmark = pytest.mark.slow

QUICK = [
    "training.max_steps=6", "training.logging_steps=1", "training.save_steps=2", "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1", "data.max_eval_samples=16",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_", "SUPERTUNE_FAULT"))}
    # W&B keeps settings and caches under the home directory: keep the tests' own.
    env.update(WANDB_CONFIG_DIR=str(tmp / "wandb-config"), WANDB_CACHE_DIR=str(tmp / "wandb-cache"))
    env.update(WANDB_DATA_DIR=str(tmp / "wandb-data"), **extra)
    return env


def _train(run_dir: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), *QUICK, *overrides]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free loopback port, a SQLite backend store and served artifacts."""
    home = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    argv = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "artifacts"),
    ]  # fmt: skip
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail(f"mlflow server did not start: {(home / 'server.log').read_text()[-2000:]}")
        time.sleep(0.25)
    yield url
    # SIGKILL: SIGTERM makes uvicorn wait for the keep-alive connections of this process's client,
    # and the store is thrown away with the test's folder.
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    log.close()


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, mlflow_server):
    """One run tracked in W&B (offline) and MLflow (the server), killed after step 4 (the newest
    checkpoint is step 2's) and run again: (run dir, ids after the first start, summary)."""
    tmp = tmp_path_factory.mktemp("tracked")
    run_dir = tmp / "run"
    sinks = ["training.report_to=[wandb,mlflow]", f"training.mlflow_tracking_uri={mlflow_server}"]
    killed = _train(run_dir, _env(tmp, SUPERTUNE_FAULT="step@4"), *sinks)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    first = read_ids(RunDir(run_dir).tracking)
    done = _train(run_dir, _env(tmp), *sinks)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resuming from checkpoint-2" in done.stderr
    assert "training.report_to" not in done.stderr  # no sink warned
    return run_dir, first, json.loads((run_dir / "summary.json").read_text())


def _mlflow_history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_mlflow_server_holds_one_run_across_the_resume(resumed_run, mlflow_server):
    from mlflow import MlflowClient

    run_dir, first, summary = resumed_run
    ids = read_ids(RunDir(run_dir).tracking)
    assert first.mlflow_run_id and ids.mlflow_run_id == first.mlflow_run_id
    assert ids.mlflow_tracking_uri == mlflow_server
    client = MlflowClient(tracking_uri=mlflow_server)
    tracked = client.get_run(ids.mlflow_run_id)
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    experiment = client.get_experiment(tracked.info.experiment_id)
    assert experiment.name == "supertune"
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [ids.mlflow_run_id]
    params = tracked.data.params
    assert params["training.max_steps"] == "6" and params["data.block_size"] == "128"
    assert params["model.config_overrides"] == "{'num_hidden_layers': 1}"
    assert params["launched.processes"] == "1" and params["launched.nodes"] == "1"
    assert params["launched.strategy"] == "ddp" and params["launched.devices"] == "1 x CPU"
    assert tracked.data.tags["supertune.run_dir"] == str(run_dir)
    # Steps 1-3 from the first start, 3-6 again from the resumed one: every step is there.
    assert set(_mlflow_history(client, ids.mlflow_run_id, "loss")) == {1, 2, 3, 4, 5, 6}
    throughput = _mlflow_history(client, ids.mlflow_run_id, "throughput_tokens_per_s")
    assert set(throughput) == {1, 2, 3, 4, 5, 6} and all(v > 0 for v in throughput.values())
    assert set(_mlflow_history(client, ids.mlflow_run_id, "tflops_per_device")) == {1, 2, 3, 4, 5, 6}
    assert tracked.data.metrics["summary/eval_loss"] == pytest.approx(summary["eval_loss"])
    assert tracked.data.metrics["summary/train_steps"] == 6
    assert _mlflow_history(client, ids.mlflow_run_id, "summary/eval_loss").keys() == {6}
    artifacts = {a.path for a in client.list_artifacts(ids.mlflow_run_id)}
    assert {"summary.json", "config.yaml", "model"} <= artifacts
    logged = json.loads(
        Path(client.download_artifacts(ids.mlflow_run_id, "summary.json", str(run_dir.parent))).read_text()
    )
    assert logged["eval_loss"] == summary["eval_loss"] and logged["resumed_from_step"] == 2


def _wandb_records(folder: Path) -> list[dict]:
    """The records of an offline W&B run, read by W&B's own reader of .wandb files."""
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_wandb_offline_runs_are_one_run_read_back_by_wandb(resumed_run):
    run_dir, first, summary = resumed_run
    ids = read_ids(RunDir(run_dir).tracking)
    assert first.wandb_run_id and ids.wandb_run_id == first.wandb_run_id
    folders = offline_wandb_runs(RunDir(run_dir))
    assert len(folders) == 2 and all(f.name.endswith(f"-{ids.wandb_run_id}") for f in folders)
    # The first start was SIGKILLed: W&B's writer (a process of its own) had not flushed its
    # buffered records, so its file may hold little more than a header. metrics.jsonl has them.
    killed, resumed = (_wandb_records(f) for f in folders)
    (run,) = [r["run"] for r in resumed if r["type"] == "run"]
    assert run["run_id"] == ids.wandb_run_id and run["project"] == "supertune" and run["resume"]
    config = run["config"]["update"]
    assert config["training.max_steps"] == 6 and config["launched.processes"] == 1
    assert config["distributed.strategy"] == "ddp" and config["launched.started_by"] == "none"
    steps = {r["history"]["step"]["num"]: r["history"]["item"] for r in resumed if r["type"] == "history"}
    assert set(steps) == {3, 4, 5, 6}
    assert all(item["throughput_tokens_per_s"] > 0 and "loss" in item for item in steps.values())
    assert not any(r["type"] == "exit" for r in killed)  # SIGKILL: the first start never finished
    (exit_record,) = [r["exit"] for r in resumed if r["type"] == "exit"]
    assert exit_record.get("exit_code", 0) == 0
    final = {}
    for r in resumed:
        if r["type"] == "summary":
            final.update(r["summary"]["update"])
    assert final["eval_loss"] == pytest.approx(summary["eval_loss"]) and final["train_steps"] == 6
    assert final["devices"] == "1 x CPU"
    # What MLflow gets as tags and artifacts, W&B gets as config, files and summary.
    assert config["supertune.run_dir"] == str(run_dir)
    manifest = json.loads((run_dir / "model" / "supertune-model.json").read_text())
    assert final["model_manifest"] == manifest and manifest["files"]
    saved = {f["path"] for r in resumed if r["type"] == "files" for f in r["files"]["files"]}
    assert {"summary.json", "config.yaml", "model/supertune-model.json"} <= saved
    files = folders[-1] / "files"
    assert (files / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
    assert json.loads((files / "summary.json").read_text())["eval_loss"] == summary["eval_loss"]


def test_sync_uploads_every_offline_folder_and_refuses_a_run_without_one(resumed_run, tmp_path, capfd):
    from supertune.cli.main import main

    run_dir, _, _ = resumed_run
    assert main(["sync", str(run_dir), "--dry-run"]) == 0  # real `wandb sync --dry-run`: uploads nothing
    out = capfd.readouterr()
    folders = offline_wandb_runs(RunDir(run_dir))
    assert out.out.splitlines()[0].endswith("--dry-run " + " ".join(map(str, folders)))  # oldest first
    assert "Would sync 2 run(s)" in out.out + out.err
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text("{}\n")
    assert main(["sync", str(run_dir), str(bare)]) == 2
    out = capfd.readouterr()
    assert out.out == ""  # refused before anything is uploaded
    assert out.err.strip().splitlines() == [
        f"supertune: error: RUN: no offline W&B run in {bare} (no wandb/offline-run-*/run-*.wandb): "
        "only a run trained with training.report_to: [wandb] in offline mode has one"
    ]


def test_an_unreachable_mlflow_server_warns_once_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    closed = f"http://127.0.0.1:{_free_port()}"
    proc = _train(
        run_dir, _env(tmp_path), "training.report_to=[mlflow]", f"training.mlflow_tracking_uri={closed}",
        "training.max_steps=2", "training.save_strategy=no",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "training.report_to" in line]
    assert len(warnings) == 1 and "mlflow could not start" in warnings[0] and "metrics.jsonl" in warnings[0]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert (run_dir / "summary.json").is_file()


def test_the_default_mlflow_store_is_in_the_run_directory(tmp_path, monkeypatch, caplog):
    """No URI in the config or the environment: a SQLite store in <run dir>/mlflow, artifacts beside it;
    a second start continues the same run. Other ranks track nothing. A store lost during a run
    (its folder removed) turns the sink off with one warning."""
    from mlflow import MlflowClient

    for key in [k for k in os.environ if k.startswith(("MLFLOW_", "WANDB_"))]:
        monkeypatch.delenv(key)
    cfg = RunConfig()
    cfg.training.report_to = ["mlflow"]
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    assert Tracking.for_run(cfg, run, LaunchEnvironment(rank=1, world_size=2), "2 x CPU").sinks == []
    assert not run.tracking.exists()
    starts = []
    for step in (3, 5):
        tracking = Tracking.for_run(cfg, run, LaunchEnvironment(), "1 x CPU")
        assert [s.name for s in tracking.sinks] == ["mlflow"]
        tracking.log(step, {"loss": 1.0 / step, "note": "text is not a metric", "flag": True})
        tracking.close("stopped" if step == 3 else "finished", step, None if step == 3 else {"eval_loss": 0.5})
        starts.append(read_ids(run.tracking).mlflow_run_id)
    assert starts[0] == starts[1]
    uri = f"sqlite:///{run.mlflow / 'mlflow.db'}"
    assert read_ids(run.tracking).mlflow_tracking_uri == uri
    client = MlflowClient(tracking_uri=uri)
    tracked = client.get_run(starts[0])
    assert tracked.info.status == "FINISHED"
    assert set(tracked.data.metrics) == {"loss", "summary/eval_loss"}
    assert tracked.info.artifact_uri.startswith((run.mlflow / "artifacts").as_uri())
    tracking = Tracking.for_run(cfg, run, LaunchEnvironment(), "1 x CPU")
    shutil.rmtree(run.mlflow)
    with caplog.at_level(logging.WARNING, logger="supertune"):
        tracking.log(6, {"loss": 0.1})
        tracking.log(7, {"loss": 0.1})
        tracking.close("finished", 7, {"eval_loss": 0.4})
    warnings = [r.getMessage() for r in caplog.records if r.name == "supertune"]
    assert len(warnings) == 1 and warnings[0].startswith("training.report_to: mlflow stopped logging")
    assert tracking.sinks == []


def test_a_backend_that_is_not_installed_is_named_with_its_pin(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    cfg = RunConfig()
    cfg.training.report_to = ["tensorboard", "wandb"]
    run = RunDir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="supertune"):
        tracking = Tracking.for_run(cfg, run, LaunchEnvironment(), "1 x CPU")
    assert tracking.sinks == []
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "supertune"]
    assert warning.startswith("training.report_to: wandb is not installed here") and "install wandb==" in warning
    assert read_ids(run.tracking).wandb_run_id is None


def test_a_federation_is_one_tracked_group(tmp_path, capfd):
    """One round of two local sites that report to both backends: MLflow's store in the federation
    directory holds one run per site and round and the global series, all tagged with one group in
    one experiment; W&B's offline runs carry the same group, read back by W&B's own reader."""
    import yaml
    from mlflow import MlflowClient

    from supertune.federation.config.default import site_corpus

    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        sites.append({"name": name, "steps_per_round": 2, "overrides": [
            f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0",
            "training.report_to=[wandb,mlflow]", "training.logging_steps=1", "training.warmup_steps=0",
            "data.max_eval_samples=8",
        ]})  # fmt: skip
    config = {"name": "fed-tracked", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "sites": sites}
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    fed = tmp_path / "fed"
    argv = [sys.executable, "-m", "supertune", "federate", str(path), "--dir", str(fed)]
    here = tmp_path / "cwd"  # where the command runs: nothing may be written there
    here.mkdir()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp_path), timeout=600, cwd=here)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training.report_to" not in proc.stderr  # no sink warned
    assert not list(here.iterdir())  # the artifacts are beside the federation's store, not in ./mlruns
    assert (fed / "mlflow" / "artifacts").is_dir()
    client = MlflowClient(tracking_uri=f"sqlite:///{fed / 'mlflow' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "fed-tracked"]
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"fed-tracked-site-a-r001", "fed-tracked-site-b-r001", "fed-tracked-global"}
    groups = {r.data.tags["supertune.group"] for r in runs.values()}
    assert len(groups) == 1 and groups.pop().startswith("fed-tracked-")
    assert all(r.info.status == "FINISHED" for r in runs.values())
    site_a = runs["fed-tracked-site-a-r001"]
    assert set(_mlflow_history(client, site_a.info.run_id, "loss")) == {1, 2}
    assert site_a.data.tags["supertune.run_dir"] == str(fed / "round-001" / "site-a" / "run")
    global_run = runs["fed-tracked-global"]
    table = json.loads((fed / "rounds.json").read_text())
    for name in ("site-a", "site-b"):
        (row,) = [r for r in table["rows"] if r["site"] == name]
        assert _mlflow_history(client, global_run.info.run_id, f"global/{name}/eval_loss") == {
            1: pytest.approx(row["global"])
        }
    assert set(_mlflow_history(client, global_run.info.run_id, "global/eval_loss")) == {1}
    # W&B: every run of the group carries it; the global series is the federation directory's own run.
    group = site_a.data.tags["supertune.group"]
    for run_dir in (fed / "round-001" / "site-a" / "run", fed / "round-001" / "site-b" / "run", fed):
        (folder,) = offline_wandb_runs(RunDir(run_dir))
        (run,) = [r["run"] for r in _wandb_records(folder) if r["type"] == "run"]
        assert run["run_group"] == group and run["project"] == "fed-tracked", run
    (folder,) = offline_wandb_runs(RunDir(fed))
    history = [r["history"] for r in _wandb_records(folder) if r["type"] == "history"]
    assert [h["step"]["num"] for h in history] == [1] and "global/eval_loss" in history[0]["item"]
    # `supertune sync FED` uploads the whole group: the global series and both sites' runs.
    from supertune.cli.main import main

    assert main(["sync", str(fed), "--dry-run"]) == 0
    assert "Would sync 3 run(s)" in "".join(capfd.readouterr())
