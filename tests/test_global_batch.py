"""training.global_batch_size: the same sequences per optimizer step at any process count (the
DeepSpeed recipe's scaling table trains 1, 2, 4, 8 and 16 GPUs at train_batch_size=16)."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from supertune.cli.main import main
from supertune.config.errors import ConfigError
from supertune.resolve import resolve, resolve_run_config
from supertune.resolve.global_batch import fit_global_batch, planned_world_size, split_global_batch


@pytest.mark.parametrize(("global_batch", "world", "most", "split"), [
    (16, 1, 8, (8, 2)), (16, 2, 8, (8, 1)), (16, 4, 8, (4, 1)), (16, 8, 8, (2, 1)), (16, 16, 8, (1, 1)),
    (16, 1, 16, (16, 1)), (12, 1, 8, (6, 2)), (24, 2, 5, (4, 3)), (7, 1, 4, (1, 7)), (64, 16, 8, (4, 1)),
])  # fmt: skip
def test_the_largest_per_device_batch_that_divides_the_share(global_batch, world, most, split):
    assert split_global_batch(global_batch, world, most) == split
    per_device, accumulation = split
    assert per_device * accumulation * world == global_batch and per_device <= most


def test_an_impossible_split_names_the_numbers():
    with pytest.raises(ConfigError) as info:
        split_global_batch(16, 3, 8)
    assert str(info.value) == (
        "training.global_batch_size: 16 sequences cannot be split over 3 processes (16 / 3 is not whole); "
        "use a multiple of 3 (15, 18) or another process count"
    )


def test_the_run_config_holds_the_split_for_the_planned_processes():
    base = ["training.global_batch_size=16", "training.per_device_train_batch_size=8"]
    one = resolve_run_config(None, base).training
    two = resolve_run_config(None, [*base, "launch.nproc=2"]).training
    assert (one.per_device_train_batch_size, one.gradient_accumulation_steps, one.global_batch_size) == (8, 2, 16)
    assert (two.per_device_train_batch_size, two.gradient_accumulation_steps) == (8, 1)
    # a SLURM job's processes: nodes x GPUs per node of the profile (LUMI: 8 GCDs)
    lumi = resolve(None, [*base, "launch.cluster=lumi", "launch.nodes=2", "training.bf16=true"])
    assert planned_world_size(lumi.config, lumi.profile) == 16
    assert (lumi.config.training.per_device_train_batch_size, lumi.config.training.gradient_accumulation_steps) == (
        1,
        1,
    )
    with pytest.raises(ConfigError, match="16 sequences cannot be split over 3 processes"):
        resolve_run_config(None, [*base, "launch.nproc=3"])


def test_each_process_fits_the_split_to_its_real_world_size(caplog):
    cfg = resolve_run_config(
        None, ["training.global_batch_size=16", "training.per_device_train_batch_size=8"]
    )  # 8 x 2 for 1
    with caplog.at_level(logging.INFO, logger="supertune"):
        same = fit_global_batch(cfg, 1)
        four = fit_global_batch(cfg, 4)
    assert same is cfg
    assert (four.training.per_device_train_batch_size, four.training.gradient_accumulation_steps) == (4, 1)
    assert (
        "global batch 16 sequences (training.global_batch_size) = 4 per process x 4 process(es) x 1 accumulation step(s)"
        in caplog.text
    )
    assert "split again" in caplog.text
    with pytest.raises(ConfigError, match="over 3 processes"):
        fit_global_batch(cfg, 3)


def test_a_resume_with_another_process_count_keeps_the_global_batch():
    from supertune.train.lifecycle.resume import config_differences

    base = ["training.global_batch_size=16", "training.per_device_train_batch_size=8"]
    assert config_differences(resolve_run_config(None, base), resolve_run_config(None, [*base, "launch.nproc=2"])) == []
    plain = ["training.per_device_train_batch_size=8"]
    changed = config_differences(
        resolve_run_config(None, plain), resolve_run_config(None, [*plain, "training.gradient_accumulation_steps=2"])
    )
    assert changed == ["training.gradient_accumulation_steps: 1 -> 2"]


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_steps(tmp_path):
    """The same config, the same global batch of 16, at 1 process (8 x 2 accumulation) and 2 (real
    torchrun over gloo, 8 x 1): equal per-step losses and evaluation (the reduction order alone may
    differ), the same tokens trained."""
    common = [
        "training.global_batch_size=16",
        "training.per_device_train_batch_size=8",
        "training.max_steps=5",
        "training.logging_steps=1",
        "training.save_strategy=no",
        "training.report_to=[]",
        "generate.max_new_tokens=0",
        "model.config_overrides=num_hidden_layers=1",
        "data.max_eval_samples=32",
        "output.save_model=false",
    ]
    losses, summaries = {}, {}
    for nproc in (1, 2):
        run = tmp_path / f"nproc{nproc}"
        assert main(["train", "--run-dir", str(run), "--nproc", str(nproc), *common]) == 0
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses[nproc] = {r["step"]: r["loss"] for r in rows if "loss" in r}
        saved = yaml.safe_load((run / "config.yaml").read_text())["training"]
        assert (saved["per_device_train_batch_size"], saved["gradient_accumulation_steps"]) == (
            (8, 2) if nproc == 1 else (8, 1)
        )
        summaries[nproc] = json.loads((run / "summary.json").read_text())
        assert summaries[nproc]["world_size"] == nproc
    assert sorted(losses[1]) == sorted(losses[2]) == [1, 2, 3, 4, 5]
    worst = max(abs(losses[1][s] - losses[2][s]) for s in losses[1])
    assert worst <= 1e-4, (worst, losses)
    assert summaries[1]["train_tokens"] == summaries[2]["train_tokens"]
    assert abs(summaries[1]["eval_loss"] - summaries[2]["eval_loss"]) <= 1e-4


def test_an_epoch_is_cut_to_whole_global_batches():
    from supertune.errors import UserError
    from supertune.train.data.global_batch_data import whole_global_batches

    data = list(range(170))
    cut = whole_global_batches(data, 16)
    assert len(cut) == 160 and [cut[i] for i in range(160)] == data[:160]
    assert whole_global_batches(data, None) is data and whole_global_batches(data[:160], 16) == data[:160]
    stream = iter(data)
    assert whole_global_batches(stream, 16) is stream  # no length: a stream stops at max_steps
    with pytest.raises(UserError, match="the training split has 10 sequences, fewer than one global batch of 16"):
        whole_global_batches(data[:10], 16)
