"""The per-step checks of a training step: NaN/Inf found on the device and read once per optimizer step,
the stop agreed on by every rank, and the Trainer's FLOP estimate without a walk of the model per micro-batch."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from strategy_runs import free_port
from supertune.rundir import RunDir
from supertune.train.trainer.stopping import NonFiniteLoss, RunGuard


def _guard(tmp_path: Path, rank: int = 0) -> RunGuard:
    return RunGuard(RunDir(tmp_path), rank, lambda: "checkpoint-2")


def _step_end(guard: RunGuard, step: int) -> SimpleNamespace:
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    guard.on_step_end(SimpleNamespace(device=torch.device("cpu")), SimpleNamespace(global_step=step), control)
    return control


def test_a_nan_loss_of_one_micro_batch_stops_the_run_at_the_end_of_its_optimizer_step(tmp_path):
    guard = _guard(tmp_path)
    guard.watch_loss(torch.tensor(2.5))
    guard.watch_loss(torch.tensor(float("nan")))
    # Watched on the device: nothing has been read back to the host yet.
    assert isinstance(guard.nonfinite, torch.Tensor)
    guard.watch_loss(torch.tensor(2.4))
    guard.watch_gradient_norm(torch.tensor(float("nan")))
    with pytest.raises(NonFiniteLoss) as err:
        _step_end(guard, 3)
    message = str(err.value)
    assert message.startswith("training: the loss became NaN or Inf at step 3;"), message
    assert "the last good checkpoint is checkpoint-2" in message


def test_an_infinite_gradient_norm_is_named_as_such(tmp_path):
    guard = _guard(tmp_path)
    guard.watch_loss(torch.tensor(1.0))
    guard.watch_gradient_norm(torch.tensor(float("inf")))
    with pytest.raises(NonFiniteLoss, match=r"^training: the gradient norm became NaN or Inf at step 7;"):
        _step_end(guard, 7)


def test_a_norm_handed_over_as_a_float_is_checked_too(tmp_path):
    guard = _guard(tmp_path)
    guard.watch_loss(torch.tensor(1.0))
    guard.watch_gradient_norm(math.nan)  # DeepSpeed's engine gives a float
    with pytest.raises(NonFiniteLoss, match="the gradient norm became NaN or Inf at step 1"):
        _step_end(guard, 1)
    guard = _guard(tmp_path)
    guard.watch_gradient_norm(math.inf)
    guard.watch_loss(torch.tensor(float("-inf")))  # a tensor after a float: both kept, the loss wins
    with pytest.raises(NonFiniteLoss, match="the loss became"):
        _step_end(guard, 1)


def test_finite_steps_go_on_and_each_step_starts_clean(tmp_path):
    guard = _guard(tmp_path)
    for step in range(1, 4):
        for loss in (3.0, 2.0):
            guard.watch_loss(torch.tensor(loss / step))
        guard.watch_gradient_norm(torch.tensor(0.5))
        control = _step_end(guard, step)
        assert not control.should_training_stop and guard.stopped is None
        assert guard.nonfinite == 0
    (tmp_path / "stop-request").touch()
    control = _step_end(guard, 4)
    assert control.should_save and control.should_training_stop
    assert guard.stopped == "a stop request (stop-request)"


def _two_ranks(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = []
    try:
        guard = RunGuard(RunDir(Path(out) / f"rank{rank}"), rank, lambda: None)
        # Step 1: a stop request seen by rank 0 alone stops both.
        if rank == 0:
            guard.stop_file.parent.mkdir(parents=True, exist_ok=True)
            guard.stop_file.touch()
        guard.watch_loss(torch.tensor(1.0))
        control = _step_end(guard, 1)
        results.append(f"stop={control.should_training_stop}:{guard.stopped}")
        # Step 2: a NaN loss on rank 1 alone stops both, rank 0 naming another rank.
        guard.watch_loss(torch.tensor(float("nan") if rank == 1 else 1.0))
        try:
            _step_end(guard, 2)
            results.append("went on")
        except NonFiniteLoss as exc:
            results.append(str(exc).split(";")[0])
    finally:
        dist.destroy_process_group()
    Path(out, f"result{rank}.txt").write_text("\n".join(results))


def test_two_ranks_agree_on_a_stop_and_on_a_nan_one_of_them_saw(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0 = (tmp_path / "result0.txt").read_text().splitlines()
    rank1 = (tmp_path / "result1.txt").read_text().splitlines()
    assert rank0 == [
        "stop=True:a stop request (stop-request)",
        "training: the loss or gradient norm (of another rank) became NaN or Inf at step 2",
    ]
    assert rank1 == [
        "stop=True:a stop request on another rank",
        "training: the loss became NaN or Inf at step 2",
    ]


def test_the_flop_estimate_is_the_trainers_without_walking_the_model_each_micro_batch(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from supertune.train.trainer.guarded_trainer import GuardedTrainer

    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    )
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = GuardedTrainer(model=model, args=args)
    walks = []
    counted = model.num_parameters

    def counting(*a, **k):
        walks.append(1)
        return counted(*a, **k)

    model.num_parameters = counting
    batches = [{"input_ids": torch.zeros(b, 9, dtype=torch.long)} for b in (1, 4, 2)]
    ours = [trainer.floating_point_ops(batch) for batch in batches]
    assert len(walks) == 1  # counted once, then remembered
    theirs = [Trainer.floating_point_ops(trainer, batch) for batch in batches]
    assert ours == theirs and ours[1] == 6 * 36 * counted(exclude_embeddings=True)
    assert trainer.floating_point_ops({"labels": torch.zeros(1, 3)}) == 0
