"""`supertune sweep` and `supertune report` for real: a local sweep of 1 and 2 processes, its table
(every number equal to the runs' summaries) and its PNGs; a one-run report; SLURM sweeps planned
and rendered without a cluster (--dry-run), and the scales a sweep refuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

QUICK = [
    "training.max_steps=10", "training.logging_steps=2", "training.save_strategy=no", "generate.max_new_tokens=0",
    "model.config_overrides=num_hidden_layers=1", "data.max_eval_samples=32", "training.report_to=[]",
    "output.save_model=false", "training.per_device_train_batch_size=8",
]  # fmt: skip


def _supertune(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supertune", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    sweep_dir = root / "sweep"
    proc = _supertune("sweep", "--nproc", "1,2", "--sweep-dir", str(sweep_dir), *QUICK, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = _supertune("report", str(sweep_dir), cwd=root)
    assert report.returncode == 0, report.stderr[-3000:]
    return sweep_dir, proc, report


def _summaries(sweep_dir: Path) -> list[dict]:
    return [json.loads((sweep_dir / f"devices-{n}" / "summary.json").read_text()) for n in (1, 2)]


def _table(markdown: str) -> list[list[str]]:
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]  # without the header and its rule


@pytest.mark.slow
def test_the_sweep_trains_each_scale_with_the_same_global_batch(local_sweep):
    sweep_dir, proc, _ = local_sweep
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert (manifest["mode"], manifest["keep"], manifest["scaling"]) == ("local", "global-batch", "strong")
    runs = {r["devices"]: r for r in manifest["runs"]}
    assert (runs[1]["per_device_train_batch_size"], runs[2]["per_device_train_batch_size"]) == (8, 4)
    assert all(r["state"] == "finished" and r["gradient_accumulation_steps"] == 1 for r in runs.values())
    one, two = _summaries(sweep_dir)
    assert (one["world_size"], two["world_size"]) == (1, 2) and one["train_tokens"] == two[
        "train_tokens"
    ] == 10 * 8 * 128
    # Strong scaling with DDP: the same optimisation, so the same loss (to reduction order).
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=1e-4)
    assert "1 process(es): finished" in proc.stderr and "supertune report" in proc.stderr


@pytest.mark.slow
def test_the_table_numbers_are_the_summaries(local_sweep):
    sweep_dir, _, report = local_sweep
    one, two = _summaries(sweep_dir)
    assert "strong-scaling efficiency" in report.stdout
    rows = _table(report.stdout)
    speedup = two["throughput_tokens_per_s"] / one["throughput_tokens_per_s"]
    for row, s, expect in zip(rows, (one, two), (1.0, speedup)):
        devices, nodes, train_time, rate, row_speedup, efficiency, mfu, eval_loss = row
        assert (int(devices), int(nodes)) == (s["world_size"], s["nodes"]) == (s["world_size"], 1)
        assert train_time == f"{s['train_runtime_s']:.1f}"
        assert rate == f"{s['throughput_tokens_per_s']:,.0f}"
        assert row_speedup == f"{expect:.2f}x" and efficiency == f"{expect / s['world_size']:.0%}"
        assert mfu == "n/a (CPU)" and s["mfu"] is None
        assert eval_loss == f"{s['eval_loss']:.4f}"
    saved = json.loads((sweep_dir / "report" / "report.json").read_text())
    assert [r["tokens_per_s"] for r in saved["rows"]] == [
        one["throughput_tokens_per_s"],
        two["throughput_tokens_per_s"],
    ]
    assert saved["rows"][1]["speedup"] == speedup and saved["scaling"] == "strong"
    assert report.stdout in (sweep_dir / "report" / "report.md").read_text()  # the printed table is the written one


def _assert_png_has_a_plot(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 300 and image.height > 200
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 20, path  # lines, markers, text: not a blank canvas


@pytest.mark.slow
def test_the_plots_open_and_their_axes_hold_data(local_sweep):
    from supertune.sweeps.plots import figure_losses, figure_per_device, figure_speedup
    from supertune.sweeps.report import load_runs, scaling_rows

    sweep_dir, _, _ = local_sweep
    names = sorted(p.name for p in (sweep_dir / "report").glob("*.png"))
    assert names == ["loss.png", "speedup.png", "tokens_per_device.png"]
    for name in names:
        _assert_png_has_a_plot(sweep_dir / "report" / name)
    runs, _, _ = load_runs([str(sweep_dir)])
    rows = scaling_rows(runs)
    speedup = figure_speedup(rows).axes[0]
    measured = next(line for line in speedup.lines if line.get_label().startswith("measured"))
    assert list(measured.get_xdata()) == [1, 2] and measured.get_ydata()[0] == 1.0
    assert len(figure_per_device(rows).axes[0].patches) == 2  # one bar per scale
    losses = figure_losses(runs).axes[0]
    curves = [line for line in losses.lines if line.get_label() in ("1 device", "2 devices")]
    assert len(curves) == 2 and all(len(line.get_xdata()) >= 5 for line in curves)


@pytest.mark.slow
def test_one_run_gets_its_loss_learning_rate_and_throughput_curves(local_sweep, tmp_path):
    from supertune.sweeps.plots import figure_run_curves, figure_run_throughput
    from supertune.sweeps.report import load_runs

    sweep_dir, _, _ = local_sweep
    run_dir = sweep_dir / "devices-2"
    proc = _supertune("report", str(run_dir), "--out", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "one").glob("*.png")) == ["loss_lr.png", "throughput.png"]
    for png in (tmp_path / "one").glob("*.png"):
        _assert_png_has_a_plot(png)
    (run,), _, _ = load_runs([str(run_dir)])
    loss_ax, lr_ax = figure_run_curves(run).axes
    assert len(loss_ax.lines[0].get_xdata()) == 6 and len(lr_ax.lines[0].get_xdata()) == 6  # steps 1, 2, 4, ..., 10
    assert len(figure_run_throughput(run).axes[0].lines[0].get_xdata()) == 6
    assert re.search(r"\| 2 \| 1 \| [0-9.]+ \| [0-9,]+ \| - \| - \| n/a \(CPU\) \| [0-9.]+ \|", proc.stdout)


def test_a_slurm_sweep_takes_nodes_from_the_profile(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _supertune(
        "sweep",
        "--cluster",
        "leonardo",
        "--gpus",
        "1,2,4,8,16",
        "--dry-run",
        "--sweep-dir",
        str(sweep_dir),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    # Leonardo's nodes hold 4 GPUs; the default run's global batch of 16 sequences stays.
    assert [(r["devices"], r["nodes"], r["per_node"]) for r in runs] == [
        (1, 1, 1),
        (2, 1, 2),
        (4, 1, 4),
        (8, 2, 4),
        (16, 4, 4),
    ]
    assert [r["per_device_train_batch_size"] * r["devices"] * r["gradient_accumulation_steps"] for r in runs] == [
        16
    ] * 5
    assert {r["state"] for r in runs} == {"planned"} and "not submitted" in proc.stderr
    script = (sweep_dir / "devices-16" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gpus-per-node=4" in script
    config = (sweep_dir / "devices-16" / "config.yaml").read_text()
    assert re.search(r"per_device_train_batch_size: 1\b", config)


def test_per_device_batch_keeps_each_devices_batch(tmp_path):
    sweep_dir = tmp_path / "weak"
    proc = _supertune("sweep", "--cluster", "lumi", "--gpus", "8,16", "--keep", "per-device-batch", "--dry-run",
                      "--sweep-dir", str(sweep_dir), "training.gradient_accumulation_steps=2", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert manifest["scaling"] == "weak"
    assert [
        (r["nodes"], r["per_device_train_batch_size"], r["gradient_accumulation_steps"]) for r in manifest["runs"]
    ] == [(1, 16, 2), (2, 16, 2)]


def test_impossible_scales_are_refused_at_once_with_the_numbers(tmp_path):
    sweep_dir = tmp_path / "bad"
    proc = _supertune(
        "sweep", "--cluster", "leonardo", "--gpus", "1,6,32", "--dry-run", "--sweep-dir", str(sweep_dir), cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "6 devices: nodes hold 4, so 6 is not a whole number of nodes (use 4 or 8)" in proc.stderr
    assert "the global batch of 16 sequences cannot be split over 32 devices" in proc.stderr
    assert not sweep_dir.exists()  # nothing created


def test_the_batch_split_keeps_the_global_batch_and_the_memory_cap():
    from supertune.errors import UserError
    from supertune.sweeps.scales import plan_scales, split_batch

    # 8 per device x 4 accumulation at 1 device: 32 sequences per step at every scale, never more than 8 per pass.
    scales = plan_scales([1, 2, 4, 8, 16, 32], None, 8, 4, "global-batch")
    assert [(s.per_device_batch, s.accumulation) for s in scales] == [(8, 4), (8, 2), (8, 1), (4, 1), (2, 1), (1, 1)]
    assert {s.global_batch for s in scales} == {32}
    assert split_batch(24, 2, 8) == (6, 2)  # 12 per device: the largest batch <= 8 that divides 12
    with pytest.raises(UserError, match="not whole"):
        plan_scales([1, 64], None, 8, 4, "global-batch")
    # The smallest scale decides the global batch: 2 devices x 8 = 16.
    assert [s.global_batch for s in plan_scales([2, 4], 4, 8, 1, "global-batch")] == [16, 16]


@pytest.mark.slow
def test_a_run_killed_while_writing_and_a_damaged_summary(local_sweep, tmp_path):
    """A metrics line cut short by a kill is left out of the plots (the whole lines stay); a summary.json
    that is not a JSON object is one line naming the file, not a traceback."""
    import shutil

    from supertune.sweeps.plots import figure_run_curves
    from supertune.sweeps.report import load_runs

    sweep_dir, _, _ = local_sweep
    run_dir = tmp_path / "killed"
    shutil.copytree(sweep_dir / "devices-1", run_dir)
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"loss": 1.25, "step": 1')  # the kill came mid-line
    proc = _supertune("report", str(run_dir), "--out", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr
    (run,), _, _ = load_runs([str(run_dir)])
    assert len(figure_run_curves(run).axes[0].lines[0].get_xdata()) == 6
    (run_dir / "summary.json").write_text('{"eval_loss": 2.1,', encoding="utf-8")
    proc = _supertune("report", str(run_dir), "--out", str(tmp_path / "two"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        f"supertune: error: RUN_DIR {run_dir}: {run_dir}/summary.json is not JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 19 (char 18); supertune writes it when a run finishes: restore it, or train the run again"
    )
