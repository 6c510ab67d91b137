"""`supertune prepare --submit`: job scripts (golden files, bash -n, shellcheck), parts and merge on
real files, and the array on the real Slurm test cluster, byte-identical to a single-process store.

SUPERTUNE_UPDATE_GOLDEN=1 rewrites the golden files from the current renderer (then review the diff).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supertune.cli.main import main
from supertune.clusters import load_profile
from supertune.slurm.prepare_script import PrepareJob, render_array_script, render_merge_script

GOLDEN = Path(__file__).resolve().parent / "golden" / "prepare"
UPDATE = os.environ.get("SUPERTUNE_UPDATE_GOLDEN", "") not in ("", "0")
HOSTILE = 'it\'s a "store" #1 $(touch pwned) `touch pwned`; x %j'
JOB = PrepareJob(
    name="prepare-corpus",
    work="/scratch/tokens/corpus.prepare",
    out="/scratch/tokens/corpus",
    parts=8,
    cpus=16,
    time="04:00:00",
    partition="small",
    account="project_465000000",
    qos=None,
    mem=None,
    extra_args=(),
    python="/opt/supertune/venv/bin/python",
)


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERTUNE_CONFIG_DIR", str(tmp_path / "no-user-config"))


def _scripts(job: PrepareJob, profile: str, tasks: list[int]) -> dict[str, str]:
    p = load_profile(profile)
    return {
        f"{profile}-array.sbatch": render_array_script(job, p, tasks),
        f"{profile}-merge.sbatch": render_merge_script(job, p),
    }


@pytest.mark.parametrize("profile", ["local", "lumi"])
def test_prepare_scripts_match_golden_files_and_pass_bash_n_and_shellcheck(profile: str, tmp_path: Path) -> None:
    for name, text in _scripts(JOB, profile, list(range(8))).items():
        golden = GOLDEN / name
        if UPDATE:
            golden.write_text(text, encoding="utf-8")
        assert text == golden.read_text(encoding="utf-8"), f"{name} changed; SUPERTUNE_UPDATE_GOLDEN=1 to accept"
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
        lint = subprocess.run(
            [_shellcheck(), "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0, lint.stdout


def test_only_unfinished_parts_are_array_tasks() -> None:
    p = load_profile("local")
    assert "#SBATCH --array=1,4\n" in render_array_script(JOB, p, [1, 4])
    assert "#SBATCH --array=2-7\n" in render_array_script(JOB, p, list(range(2, 8)))
    assert "#SBATCH --array=5\n" in render_array_script(JOB, p, [5])


def test_hostile_paths_are_quoted_and_run_nothing(tmp_path: Path) -> None:
    """A work directory full of shell syntax: the script runs the step with the path as one word."""
    work = tmp_path / f"{HOSTILE}.prepare"
    job = dataclasses.replace(
        JOB, work=str(work), out=str(tmp_path / HOSTILE), name=f"prepare-{HOSTILE}", python="echo"
    )
    for name, text in _scripts(job, "local", [0, 1]).items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        ran = subprocess.run(
            ["bash", str(path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"},
        )
        assert ran.returncode == 0, ran.stderr
        words = ran.stdout.split("\n")[-2]
        assert str(work) in words
    assert not list(tmp_path.rglob("pwned")), "a value was executed"


def test_submit_flags_are_checked(capsys) -> None:
    cases = [
        (["prepare", "--out", "/tmp/x", "--shards", "3"], "--shards: only applies with --submit"),
        (["prepare", "--out", "/tmp/x", "--submit", "--shards", "3"], "--cluster: --submit needs the cluster profile"),
        (
            ["prepare", "--out", "/tmp/x", "--submit", "--cluster", "local"],
            "--shards: --submit needs a positive number",
        ),
        (
            ["prepare", "--out", "/tmp/x", "--submit", "--cluster", "local", "--shards", "0"],
            "--shards: --submit needs a positive number",
        ),
        (["prepare", "--part", "1"], "--part: give both --part I and --work DIR"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


# ---- parts and merge on real files -------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("array-data")
    lines = [
        json.dumps(
            {
                "text": f"Entry {i}: "
                + " ".join(["alder", "harbor", "lantern", "stone"][(i * k) % 4] for k in range(5 + i % 40))
            }
        )
        for i in range(900)
    ]
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _overrides(corpus: Path) -> list[str]:
    return [f"data.train_files={corpus / 'train.jsonl'}", "data.validation_split_percentage=10"]


def _same_store(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and len(names) > 6, names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_parts_merged_equal_a_single_prepare_and_finished_parts_are_skipped(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """Without Slurm: what each array task and the merge job run, called directly."""
    from supertune.config import dump_config
    from supertune.resolve import resolve_run_config
    from supertune.store.array import finished_parts, plan_array

    assert main(["prepare", "--out", str(tmp_path / "single"), "--shard-tokens", "2000", *_overrides(corpus)]) == 0
    out = tmp_path / "merged"
    cfg = resolve_run_config(None, [*_overrides(corpus), "data.store=", "model.bundle=", "data.streaming=false"])
    work = plan_array(cfg, dump_config(cfg), out, 3, 2000, False, False)
    for i in (2, 0, 1):
        assert main(["prepare", "--part", str(i), "--work", str(work)]) == 0
    assert finished_parts(work, 3) == [0, 1, 2]
    part = work / "parts" / "part-00001" / "train.bin"
    before = part.stat().st_mtime_ns
    capsys.readouterr()
    assert main(["prepare", "--part", "1", "--work", str(work)]) == 0
    assert "part 1 of 3 is finished already; skipped" in capsys.readouterr().err
    assert part.stat().st_mtime_ns == before
    assert main(["prepare", "--merge", str(work)]) == 0
    _same_store(tmp_path / "single", out)
    assert not (work / "parts").exists()  # removed after the merge; config, plan and logs stay


def test_merge_refuses_unfinished_parts_and_another_plan_is_refused(corpus: Path, tmp_path: Path, capsys) -> None:
    from supertune.config import dump_config
    from supertune.errors import UserError
    from supertune.resolve import resolve_run_config
    from supertune.store.array import plan_array

    cfg = resolve_run_config(None, [*_overrides(corpus), "data.store=", "model.bundle=", "data.streaming=false"])
    out = tmp_path / "store"
    work = plan_array(cfg, dump_config(cfg), out, 3, 2000, False, False)
    assert main(["prepare", "--part", "0", "--work", str(work)]) == 0
    capsys.readouterr()
    assert main(["prepare", "--merge", str(work)]) == 2
    err = capsys.readouterr().err
    assert "--merge: part(s) 1, 2 of 3 are not finished" in err and "finished parts are kept" in err
    assert not out.exists()
    with pytest.raises(UserError, match="holds the parts of another prepare"):
        plan_array(cfg, dump_config(cfg), out, 4, 2000, False, False)
    assert (work / "parts" / "part-00000").is_dir()  # nothing was discarded
    plan_array(cfg, dump_config(cfg), out, 4, 2000, False, True)
    assert not (work / "parts" / "part-00000").exists()


# ---- the real Slurm test cluster -------------------------------------------------------------


def test_array_job_on_slurm_equals_a_single_prepare_and_a_rerun_redoes_only_missing_parts(
    slurm_single, corpus: Path, tmp_path: Path
) -> None:
    """3 array tasks and a merge job through real sbatch. The merge job is cancelled before it can
    start and one finished part is deleted (a task that failed); submitting again runs one task and
    the merge, and the store is byte-identical to a single-process prepare of the same config."""
    env = slurm_single.env
    env["SUPERTUNE_CONFIG_DIR"] = str(tmp_path / "no-user-config")
    single, out = tmp_path / "single", tmp_path / "array store"
    assert main(["prepare", "--out", str(single), "--shard-tokens", "2000", *_overrides(corpus)]) == 0
    submit = [
        sys.executable,
        "-m",
        "supertune",
        "prepare",
        "--out",
        str(out),
        "--shard-tokens",
        "2000",
        "--submit",
        "--cluster",
        "local",
        "--shards",
        "3",
        "--cpus",
        "1",
        "--time",
        "00:10:00",
        *_overrides(corpus),
    ]
    first = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    merge = int(first.stdout.strip())
    slurm_single.scancel(merge)  # still waiting for the array: it never runs
    work = tmp_path / "array store.prepare"
    _wait_for(lambda: len(list((work / "parts").glob("part-*"))) == 3 and not _queued(slurm_single), 150, work)
    assert sorted(p.name for p in (work / "logs").glob("*.err")) == [
        f"prepare-array store-{first.stderr.split('array job ')[1].split()[0]}_{i}.err" for i in range(3)
    ]
    shutil.rmtree(work / "parts" / "part-00001")

    second = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "2 of 3 parts are finished already" in second.stderr and "(1 tasks)" in second.stderr
    assert "#SBATCH --array=1\n" in (work / "array.sbatch").read_text()
    assert slurm_single.wait(int(second.stdout.strip()), timeout=150) == "COMPLETED"
    _same_store(single, out)
    logs = "".join(p.read_text() for p in (work / "logs").iterdir())
    assert "supertune: prepare train part 1/3: " in logs and "Traceback" not in logs
    assert main(["prepare", "--verify", str(out)]) == 0


def _queued(cluster) -> bool:
    return bool(cluster.run("squeue", "--noheader", "--format=%i").stdout.strip())


def _wait_for(condition, timeout: float, work: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in sorted((work / "logs").glob("*")))
            raise TimeoutError(f"array tasks not finished after {timeout} s:\n{logs}")
        time.sleep(0.5)


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail("shellcheck not installed, and CI is set", pytrace=False)
    pytest.skip("shellcheck not installed (tests/cluster/install.sh installs it)")
