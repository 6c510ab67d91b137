"""`supertune submit`, `status`, `logs` (and --follow) and `cancel` against the real queue of the
Slurm test cluster, with a run name and run directory full of characters a shell or sbatch could
misread; a profile's node_dirs made on the node by the job, after a refusal before sbatch left the
queue alone."""

from __future__ import annotations

import time
from pathlib import Path

from cluster.slurm_cluster import SlurmCluster, wait_for_text
from slurm_fixtures import TINY_JOB, supertune

TINY = [
    *TINY_JOB,
    "training.save_strategy=no",
    "launch.procs_per_node=1",
]
# No '/' (a run name names a directory); everything else a shell or sbatch's header reader could act on.
HOSTILE_NAME = 'it\'s a "run" #1 $(touch pwned) `touch pwned`; x %j'


def _submit(slurm_client: dict[str, str], cwd: Path, run_dir: Path, *overrides: str, launcher: str = "srun") -> int:
    proc = supertune(
        "submit",
        "--cluster",
        "local",
        "--launcher",
        launcher,
        "--run-dir",
        str(run_dir),
        *TINY,
        *overrides,
        env=slurm_client,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isdigit(), proc.stdout  # only the job id on stdout
    return int(proc.stdout)


def _status_row(slurm_client: dict[str, str], cwd: Path, *args: str) -> list[str]:
    proc = supertune("status", *args, env=slurm_client, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["RUN", "JOB", "CLUSTER", "STATE"]
    return lines[1:]


def test_follow_logs_and_status_of_a_finished_job(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path
) -> None:
    runs_root = tmp_path / f"runs {HOSTILE_NAME}"
    run_dir = runs_root / f"{HOSTILE_NAME}-1"
    job = _submit(slurm_client, tmp_path, run_dir, "training.max_steps=4", f"output.name={HOSTILE_NAME}")
    # Started at once, so it follows the job through PENDING and RUNNING and must end by itself.
    follow = supertune("logs", str(run_dir), "--follow", "--poll", "0.5", env=slurm_client, cwd=tmp_path, timeout=300)
    assert follow.returncode == 0, follow.stderr
    assert slurm_single.job_state(job) == "COMPLETED"

    out, err = (run_dir / "logs" / f"{HOSTILE_NAME}-{job}.out"), (run_dir / "logs" / f"{HOSTILE_NAME}-{job}.err")
    text = out.read_text() + err.read_text()
    assert len(follow.stdout) == len(text) and sorted(follow.stdout.splitlines()) == sorted(text.splitlines())
    assert f"supertune: job {job} on 1 node(s), 1 processes (srun)" in text
    assert "supertune: rank 0 of 1 on " in text and "progress: step 4/4 (100%)" in text
    assert "Traceback" not in text, text[-3000:]
    assert not list(tmp_path.rglob("pwned")), "a value was executed"
    assert slurm_single.job_info(job)["JobName"] == HOSTILE_NAME

    plain = supertune("logs", str(run_dir), env=slurm_client, cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout == text

    # By path, by run-name prefix under --runs-root, and every run under --runs-root.
    for args in ([str(run_dir)], ["it's a", "--runs-root", str(runs_root)], ["--runs-root", str(runs_root)]):
        rows = _status_row(slurm_client, tmp_path, *args)
        assert len(rows) == 1 and f" {job} " in rows[0] and " local " in rows[0] and " COMPLETED " in rows[0], rows


def test_cancel_ends_a_running_job(slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "long"
    job = _submit(slurm_client, tmp_path, run_dir, "training.max_steps=100000", "output.name=long", launcher="torchrun")
    # Running means training processes exist, not only the job: wait for the worker's first line.
    wait_for_text(run_dir / "logs" / f"long-{job}.out", "supertune: rank 0 of 1", timeout=180)
    assert " RUNNING " in _status_row(slurm_client, tmp_path, str(run_dir))[0]

    cancel = supertune("cancel", str(run_dir), env=slurm_client, cwd=tmp_path)
    assert cancel.returncode == 0 and cancel.stdout.strip() == f"cancelled job {job}", cancel.stdout + cancel.stderr
    assert slurm_single.wait(job, timeout=60) == "CANCELLED"
    assert " CANCELLED " in _status_row(slurm_client, tmp_path, str(run_dir))[0] + " "
    again = supertune("cancel", str(run_dir), env=slurm_client, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("nothing to cancel")
    # The job's processes (torchrun's agent and its worker) are gone with it.
    deadline = time.monotonic() + 30
    while _processes_naming(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_naming(run_dir)
    follow = supertune("logs", str(run_dir), "--follow", env=slurm_client, cwd=tmp_path, timeout=30)
    assert follow.returncode == 0 and "supertune: rank 0 of 1" in follow.stdout


def _processes_naming(path: Path) -> list[str]:
    needle = str(path).encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            data = cmdline.read_bytes()
        except OSError:
            continue
        if needle in data:
            found.append(data.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_a_job_slurm_has_forgotten_counts_as_ended(slurm_client: dict[str, str], tmp_path: Path) -> None:
    """After MinJobAge Slurm no longer knows a job: status says UNKNOWN, logs --follow returns at once,
    cancel has nothing to do (none of them hangs or fails)."""
    run_dir = tmp_path / "old"
    proc = supertune("submit", "--dry-run", "--run-dir", str(run_dir), env=slurm_client, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir / "jobs.jsonl").write_text('{"job_id": "987654", "cluster": "local", "submitted_at": 0}\n')
    assert " UNKNOWN " in _status_row(slurm_client, tmp_path, str(run_dir))[0] + " "
    follow = supertune("logs", str(run_dir), "--follow", env=slurm_client, cwd=tmp_path, timeout=30)
    assert follow.returncode == 0 and follow.stdout == "" and "no log" in follow.stderr
    cancel = supertune("cancel", str(run_dir), env=slurm_client, cwd=tmp_path)
    assert cancel.returncode == 0 and cancel.stdout.startswith("nothing to cancel"), cancel.stderr


def test_node_dirs_are_made_on_the_node_and_a_refused_job_never_reaches_the_queue(
    slurm_single: SlurmCluster, slurm_client: dict[str, str], tmp_path: Path, monkeypatch, capsys
) -> None:
    from supertune.cli.main import main

    node = tmp_path / "node"  # the test cluster's node is this host: its disk is this one
    user_profile = Path(slurm_client["SUPERTUNE_CONFIG_DIR"]) / "clusters" / "local.yaml"
    user_profile.parent.mkdir(parents=True)
    dirs = f"node_dirs: ['${{ND_CACHE}}', '{node}/plain']\n"  # as LUMI's MIOpen cache: through a variable
    user_profile.write_text(
        f"env:\n  ND_CACHE: {node}/cache-${{SLURM_JOB_ID}}\n  ND_HOME: /scratch/PROJECT_000/me\n"
        f"placeholders: [PROJECT_000]\n{dirs}"
    )
    run_dir = tmp_path / "run"
    argv = ["submit", "--cluster", "local", "--run-dir", str(run_dir), *TINY, "training.max_steps=1", "output.name=nd"]
    for name, value in slurm_client.items():  # in this process: a refusal costs no interpreter start
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert "env.ND_HOME is '/scratch/PROJECT_000/me', which holds the shipped placeholder" in capsys.readouterr().err
    assert slurm_single.run("squeue", "-h", "-n", "nd", "-o", "%i").stdout == "" and not run_dir.exists()

    user_profile.write_text(f"env:\n  ND_CACHE: {node}/cache-${{SLURM_JOB_ID}}\n{dirs}")
    job = _submit(slurm_client, tmp_path, run_dir, "training.max_steps=1", "output.name=nd")
    deadline = time.monotonic() + 300
    while not (node / "plain").is_dir() and time.monotonic() < deadline:  # made before the training starts
        time.sleep(0.2)
    slurm_single.scancel(job)  # the training itself is not this test's
    assert slurm_single.wait(job, timeout=120) in ("CANCELLED", "COMPLETED")
    assert sorted(p.name for p in node.iterdir()) == [f"cache-{job}", "plain"]
    assert "# Directories on each node's own disk (node_dirs)" in (run_dir / "job.sbatch").read_text()
