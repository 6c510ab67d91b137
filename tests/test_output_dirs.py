"""Directories the user names as outputs, for every command that writes one (train, submit, prepare,
prepare --submit's work directory, average, average --momentum-out, federate, sweep, report,
container): a directory of the user's own files, a regular file, a
path under a file, symbolic links (to an empty directory, dangling, in a loop) and a read-only file
system are each refused in one line naming the option, and nothing there is changed or left behind.
supertune's own output of the same kind is written into again; a directory named like a staging one
but without supertune's marker is never deleted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import supertune
from average_models import save_model
from supertune.cli.main import main
from supertune.output_dirs import STAGING_MARKER, Staging

WRITERS = [
    "train",
    "submit",
    "prepare",
    "prepare-submit",
    "average",
    "average-momentum",
    "federate",
    "sweep",
    "report",
    "container",
]
OPTIONS = {
    "train": "--run-dir",
    "submit": "--run-dir",
    "federate": "--dir",
    "sweep": "--sweep-dir",
    "average-momentum": "--momentum-out",
}
NAMES = {"prepare-submit": "out.prepare"}
"""Where a writer's obstacle is put: prepare --submit's work directory is <--out>.prepare."""
FOUND = {
    ("average-momentum", "users-files"): "is a directory; --momentum-out names a file",
    (
        "average-momentum",
        "file",
    ): "is a file supertune did not write (not its server optimizer state); choose another path",
    ("average-momentum", "symlink-to-empty"): "is a symbolic link (to {d}/empty); name the file itself",
}
"""What a writer of a file (not a directory) finds, where it differs."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    save_model(root / "a", 1)
    save_model(root / "b", 2)
    save_model(root / "g", 3)
    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text("output:\n  name: r\n")
    (run / "summary.json").write_text(json.dumps({"train_steps": 1, "world_size": 1, "eval_loss": 2.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "learning_rate": 1e-3}) + "\n")
    return root


def argv(writer: str, out: Path, inputs: Path) -> list[str]:
    return {
        "train": ["train", "--run-dir", str(out), "training.max_steps=1"],
        "submit": ["submit", "--dry-run", "--cluster", "ibex", "--run-dir", str(out)],
        "prepare": ["prepare", "--out", str(out)],
        "prepare-submit": [
            "prepare",
            "--submit",
            "--cluster",
            "ibex",
            "--shards",
            "2",
            "--dry-run",
            "--out",
            str(out).removesuffix(".prepare"),
        ],
        "average": ["average", str(inputs / "a"), str(inputs / "b"), "--weights", "uniform", "--out", str(out)],
        "average-momentum": [
            *("average", str(inputs / "a"), str(inputs / "b"), "--weights", "uniform", "--out", str(inputs / "never")),
            *("--global-model", str(inputs / "g"), "--server-momentum", "0.9", "--momentum-out", str(out)),
        ],
        "federate": ["federate", "--dir", str(out)],
        "sweep": ["sweep", "--nproc", "1,2", "--sweep-dir", str(out)],
        "report": ["report", str(inputs / "run"), "--out", str(out)],
        "container": ["container", "--cluster", "lumi", "--out", str(out)],
    }[writer]


def _users_files(d: Path, name: str) -> Path:
    out = d / name
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text("{}")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "latest").write_text("mine")
    for name in ("manifest.json", "job.sbatch", "environment.yml", "supertune.def"):
        (out / name).write_text("mine")
    return out


def _symlink(d: Path, name: str, to: str) -> Path:
    (d / "empty").mkdir()
    (d / name).symlink_to(d / to)
    if to == "loop":
        (d / "loop").symlink_to(d / name)
    return d / name


def _file(d: Path, name: str) -> Path:
    (d / name).write_text("mine")
    return d / name


def _under_file(d: Path, name: str) -> Path:
    (d / "f").write_text("mine")
    return d / "f" / "a" / name


CASES = {
    "users-files": (
        _users_files,
        "holds files supertune did not write (checkpoints, environment.yml, job.sbatch and 3 more)",
    ),
    "file": (_file, "is a file; choose another path"),
    "under-a-file": (_under_file, "lies under {d}/f, which is a file"),
    "symlink-to-empty": (
        lambda d, name: _symlink(d, name, "empty"),
        "is a symbolic link (to {d}/empty); name the directory itself",
    ),
    "dangling-symlink": (
        lambda d, name: _symlink(d, name, "nothing"),
        "is a symbolic link to {d}/nothing, which does not exist",
    ),
    "symlink-loop": (lambda d, name: _symlink(d, name, "loop"), "is a symbolic link in a loop (to {d}/loop)"),
}


def _tree(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): (os.readlink(p) if p.is_symlink() else p.read_text() if p.is_file() else "/")
        for p in sorted(d.rglob("*"))
    }


@pytest.mark.parametrize("case", CASES)
def test_every_writer_refuses_what_is_not_its_own_in_one_line(case, inputs, tmp_path, capsys, monkeypatch) -> None:
    make, found = CASES[case]
    monkeypatch.chdir(tmp_path)
    for writer in WRITERS:
        d = tmp_path / writer
        d.mkdir()
        out = make(d, NAMES.get(writer, "out"))
        before = _tree(d)
        assert main(argv(writer, out, inputs)) == 2, writer
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("supertune: error:")]
        assert lines == [err.strip().splitlines()[-1]], err
        option = OPTIONS.get(writer, "--out")
        # under a file, prepare --submit names the store itself before its work directory
        named = (out, Path(str(out).removesuffix(".prepare")))
        assert any(lines[0].startswith(f"supertune: error: {option}: {p} ") for p in named), (writer, lines)
        assert FOUND.get((writer, case), found).format(d=d) in lines[0], (writer, lines)
        assert _tree(d) == before, writer  # nothing changed, nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(WRITERS)


READ_ONLY = textwrap.dedent(
    """
    import sys
    from supertune.cli.main import main
    sys.path.insert(0, {tests!r})
    from test_output_dirs import argv, WRITERS
    from pathlib import Path
    for writer in WRITERS:
        print(writer, main(argv(writer, Path({out!r}), Path({inputs!r}))), flush=True)
    """
)


def test_a_read_only_file_system_several_levels_up_is_one_line(inputs, tmp_path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare to make a read-only bind mount")
    ro = tmp_path / "ro"
    (ro / "a").mkdir(parents=True)
    out = ro / "a" / "b" / "c" / "out"
    script = READ_ONLY.format(tests=str(Path(__file__).parent), out=str(out), inputs=str(inputs))
    shell = f'mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec {sys.executable} -c "$0"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell, script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(Path(supertune.__file__).parents[1])),
    )
    if "mount" in proc.stderr and proc.returncode != 0 and not proc.stdout:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    assert proc.stdout.split() == [w for writer in WRITERS for w in (writer, "2")], proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("supertune: error:")]
    assert len(errors) == len(WRITERS), proc.stderr
    for line in errors:
        assert line.endswith(f"{out} lies under {ro / 'a'}, which is on a read-only file system; choose another path")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in ro.iterdir()) == ["a"] and not any((ro / "a").iterdir())


def test_its_own_output_of_the_same_kind_is_written_again(inputs, tmp_path, capsys) -> None:
    for writer in ("container", "report"):
        out = tmp_path / writer
        assert main(argv(writer, out, inputs)) == 0
        assert main(argv(writer, out, inputs)) == 0, capsys.readouterr().err
    # a container's recipes are not a report, nor the reverse
    assert main(argv("report", tmp_path / "container", inputs)) == 2
    assert (
        "did not write (.supertune-output.json, environment.yml, supertune.def); supertune writes only into a new or empty directory or into its own report"
        in capsys.readouterr().err
    )


def test_a_store_is_replaced_only_when_its_manifest_is_a_stores(inputs, tmp_path, capsys) -> None:
    out = tmp_path / "users"
    out.mkdir()
    (out / "manifest.json").write_text('{"format": "someone-elses"}')
    assert main(["prepare", "--force", "--out", str(out)]) == 2
    assert (
        "holds files supertune did not write (manifest.json); supertune writes only into a new or empty directory or into its own token store"
        in capsys.readouterr().err
    )
    assert (out / "manifest.json").read_text() == '{"format": "someone-elses"}'


def test_staging_deletes_only_what_carries_its_marker_from_a_gone_process(tmp_path) -> None:
    out = tmp_path / "avg"
    users = tmp_path / ".avg.partial-12345"  # named like a staging directory, but the user's
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".avg.partial-{dead.stdout.strip()}"
    stale.mkdir()
    (stale / STAGING_MARKER).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename}))
    with Staging(out, "--out") as staging:
        assert json.loads((staging.path / STAGING_MARKER).read_text())["pid"] == os.getpid()
        (staging.path / "model.safetensors").write_text("w")
        staging.publish()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".avg.partial-12345", "avg"]
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]  # the marker does not outlive staging
    assert (users / "notes.txt").read_text() == "mine"
    with pytest.raises(OSError), Staging(tmp_path / "failed", "--out") as failing:
        (failing.path / "missing" / "file").write_text("a write that fails")
    assert not list(tmp_path.glob(".failed*")) and not (tmp_path / "failed").exists()


def test_a_refused_federation_leaves_no_directory(tmp_path, capsys) -> None:
    config = tmp_path / "fed.yaml"
    config.write_text("name: f\nrounds: 1\nsites:\n  - name: a\n    config: missing.yaml\n")
    assert main(["federate", str(config), "--dir", str(tmp_path / "new" / "fed")]) == 2
    assert "sites[0] (a).config" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fed.yaml"]


def test_huge_weights_and_a_huge_shard_count_are_answered(inputs, tmp_path, capsys) -> None:
    out = tmp_path / "avg"
    assert main(["average", str(inputs / "a"), str(inputs / "b"), "--weights", "1e308,1e308", "--out", str(out)]) == 0
    assert [i["weight"] for i in json.loads((out / "supertune-average.json").read_text())["inputs"]] == [0.5, 0.5]
    argv = [
        "prepare",
        "--submit",
        "--cluster",
        "ibex",
        "--shards",
        "1000000000000",
        "--dry-run",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main(argv) == 2
    assert "--shards: 1000000000000 array tasks are more than Slurm can run" in capsys.readouterr().err


def test_momentum_out_is_staged_beside_it_and_replaces_only_its_own_state(inputs, tmp_path, capsys) -> None:
    users = tmp_path / ".m.safetensors.partial-12345"  # named like its staging directory, but the user's
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    momentum = tmp_path / "m.safetensors"
    server = ["--global-model", str(inputs / "g"), "--server-momentum", "0.9", "--momentum-out", str(momentum)]
    for n in (1, 2):  # the second run replaces the state the first wrote
        models = [str(inputs / "a"), str(inputs / "b"), "--weights", "uniform", "--out", str(tmp_path / f"avg{n}")]
        assert main(["average", *models, *server]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".m.safetensors.partial-12345",
        "avg1",
        "avg2",
        "m.safetensors",
    ]
    assert (users / "notes.txt").read_text() == "mine"


def test_a_prepare_work_directory_sbatch_refused_is_removed(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    argv = ["prepare", "--submit", "--cluster", "ibex", "--shards", "2", "--out", str(tmp_path / "new" / "store")]
    assert main(argv) == 2
    assert "sbatch: Slurm's commands are not installed here" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
