"""Sharded checkpoints of an FSDP run: SIGKILL real torchrun processes after a checkpoint and during a
save, run the same command again, and get the weights of a run that was never interrupted.

Each rank writes its own shards (torch distributed checkpoint) into the checkpoint directory; the
manifest lists every rank's files and is checked on resume. The embedded tiny Llama, 12 steps at a
global batch of 16, a checkpoint every 4, fp32. Every run asks for hybrid sharding: with `--nproc 2`
(one node) that is full sharding over the 2 processes, the mesh {dp_shard: 2}; two torchrun agents
joined as 2 nodes of 2 make it the 2 x 2 mesh (dp_replicate, dp_shard), so one uninterrupted run
serves as the reference for both. `supertune average` reads the reference's sharded checkpoints as
the run's saved model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from strategy_runs import run_losses, two_nodes
from supertune.checkpoints.layout import CheckpointDir
from supertune.checkpoints.manifest import check_files, read_manifest

pytestmark = pytest.mark.slow

SETTINGS = [
    "distributed.strategy=fsdp",
    "distributed.fsdp.sharding=hybrid",
    "training.max_steps=12",
    "training.save_steps=4",
    "training.logging_steps=1",
    "training.global_batch_size=16",
    "training.report_to=[]",
    "generate.max_new_tokens=0",
    "data.max_eval_samples=16",  # no eval loss is compared here: the final evaluation only has to run
]
SHARDED = ("fsdp_model", "fsdp_optimizer")


def train(run_dir: Path, *extra: str, fault: str | None = None, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_FAULT")}
    if fault:
        env["SUPERTUNE_FAULT"] = fault
    argv = [sys.executable, "-m", "supertune", "train", "--run-dir", str(run_dir), "--nproc", str(nproc)]
    return subprocess.run([*argv, *SETTINGS, *extra], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run: 2 processes on one node, full sharding."""
    run = tmp_path_factory.mktemp("fsdp-reference") / "run"
    proc = train(run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


def assert_resumed_exactly(run: Path, reference: Path, resumed_from: int) -> None:
    """The final weights and every step's loss (a repeated step's last) of the reference, to 1e-5 in fp32."""
    got, want = (load_file(r / "model" / "model.safetensors") for r in (run, reference))
    assert got.keys() == want.keys()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    print(f"final weights vs the uninterrupted run: {worst:.1e}")
    assert worst <= 1e-5, f"final weights differ by {worst}"
    (got_losses, summary), (want_losses, _) = run_losses(run), run_losses(reference)
    assert got_losses.keys() == want_losses.keys()
    assert max(abs(got_losses[s] - want_losses[s]) for s in want_losses) <= 1e-5
    assert (summary["train_steps"], summary["resumed_from_step"]) == (12, resumed_from)
    assert summary["train_tokens"] == json.loads((reference / "summary.json").read_text())["train_tokens"]
    assert summary["sharding"]["wrapper"].startswith("FSDP")
    mesh = {"dp_shard": 2} if summary["world_size"] == 2 else {"dp_replicate": 2, "dp_shard": 2}
    assert summary["sharding"]["mesh"] == mesh
    layout = CheckpointDir(run / "checkpoints")
    assert not layout.staging_root.exists()
    for _, path in layout.published():
        assert check_files(path, read_manifest(path)) == []


def test_a_sharded_checkpoint_lists_every_ranks_files_and_gathers_nothing(reference):
    layout = CheckpointDir(reference / "checkpoints")
    assert layout.latest() == layout.final(12)
    manifest = read_manifest(layout.final(12))
    assert (manifest.step, manifest.world_size, manifest.global_batch, manifest.samples_seen) == (12, 2, 16, 192)
    for part in SHARDED:  # each rank's own file, and the metadata that maps every slice to one
        assert {f"{part}/__0_0.distcp", f"{part}/__1_0.distcp", f"{part}/.metadata"} <= set(manifest.files)
    for name in ("rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json", "config.yaml"):
        assert name in manifest.files, name
    # no gathered copy of the weights or the optimizer state anywhere in the checkpoint
    assert not any(name.endswith((".safetensors", ".bin")) or name == "optimizer.pt" for name in manifest.files)
    # each rank's model file holds about half of the weights (5 MB in fp32, tied embeddings saved once per name)
    rank0, rank1 = (manifest.files[f"fsdp_model/__{r}_0.distcp"]["size"] for r in (0, 1))
    assert abs(rank0 - rank1) < 0.05 * rank0


def test_average_reads_a_sharded_checkpoint_as_the_runs_saved_model(reference, tmp_path):
    """checkpoint-12 is the run's last step. Averaged with itself or with the run's gathered model/, its
    shards (read a tensor at a time under the names save_pretrained gives them, the tied lm_head.weight
    left out) give model/ back bit for bit, as a Hugging Face model directory; checkpoints 8 and 12
    give the token-weighted mean of what torch's own reader gathers from them. A changed byte in one
    rank's file is refused in one line, and nothing is written; so is a config of another model."""
    import numpy as np
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    from supertune.averaging import average_checkpoints
    from supertune.errors import UserError

    layout = CheckpointDir(reference / "checkpoints")
    last, earlier, model = layout.final(12), layout.final(8), reference / "model"
    want = load_file(model / "model.safetensors")
    assert "lm_head.weight" not in want  # tied to the embeddings: saved once
    for name, inputs in (("itself", [last, last]), ("with-model", [last, model])):
        manifest = average_checkpoints(inputs, tmp_path / name)
        assert manifest.inputs[0]["described"] == "checkpoint (FSDP shards)"
        assert "fsdp_model/__1_0.distcp" in manifest.inputs[0]["files"]
        got = load_file(tmp_path / name / "model-00001-of-00001.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        for side in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert json.loads((tmp_path / name / side).read_text()) == json.loads((model / side).read_text()), side
    AutoModelForCausalLM.from_pretrained(tmp_path / "itself")  # plain transformers loads it, no key missing

    manifest = average_checkpoints([earlier, last], tmp_path / "8-and-12")
    weights = [i["weight"] for i in manifest.inputs]
    assert weights == pytest.approx([8 / 20, 12 / 20])
    states = []
    for checkpoint in (earlier, last):
        dcp_to_torch_save(checkpoint / "fsdp_model", tmp_path / f"{checkpoint.name}.pt")
        states.append(torch.load(tmp_path / f"{checkpoint.name}.pt", weights_only=True))
    got = load_file(tmp_path / "8-and-12" / "model-00001-of-00001.safetensors")
    assert got.keys() == want.keys()
    for k in want:
        mean = states[0][k].numpy() * np.float32(weights[0]) + states[1][k].numpy() * np.float32(weights[1])
        assert np.abs(got[k].numpy() - mean).max() <= 1e-6 * max(1.0, float(np.abs(mean).max())), k

    damaged = tmp_path / "damaged"
    shutil.copytree(last, damaged)
    with (damaged / "fsdp_model" / "__1_0.distcp").open("r+b") as f:  # same size, one byte changed
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(UserError) as refused:
        average_checkpoints([model, damaged], tmp_path / "refused")
    assert str(refused.value) == (
        f"input 2 ({damaged}): fsdp_model/__1_0.distcp does not match its checkpoint manifest (sha256); "
        "the checkpoint is damaged, average another one"
    )
    assert not (tmp_path / "refused").exists() and not list(tmp_path.glob(".refused.partial-*"))

    # A config that builds another model than the one stored (3 layers, the same file size) is refused.
    other = tmp_path / "other-config"
    shutil.copytree(last, other)
    config = (other / "config.json").read_text()
    (other / "config.json").write_text(config.replace('"num_hidden_layers": 4', '"num_hidden_layers": 3'))
    with pytest.raises(UserError) as refused:
        average_checkpoints([model, other], tmp_path / "refused")
    assert str(refused.value) == (
        f"MODEL {other}: an FSDP sharded checkpoint whose tensors cannot be read as a saved model: 9 stored "
        "tensor(s) are not the config's model's, e.g. model.layers.3.self_attn.q_proj.weight; average that "
        "run's final model/ instead"
    )


@pytest.fixture(scope="module")
def killed_after_checkpoint_8(tmp_path_factory) -> Path:
    """A run killed twice: rank 0 with every file of checkpoint-8 written but no manifest (the same
    command then resumes from checkpoint-4), then rank 1 at step 10, after checkpoint-8."""
    run = tmp_path_factory.mktemp("fsdp-killed") / "run"
    killed = train(run, fault="save.staged@8")
    assert killed.returncode != 0 and not (run / "summary.json").exists(), killed.stderr[-3000:]
    assert CheckpointDir(run / "checkpoints").latest() == CheckpointDir(run / "checkpoints").final(4)
    killed = train(run, fault="step@10:1")
    out = killed.stdout + killed.stderr
    assert killed.returncode != 0 and not (run / "summary.json").exists(), out[-3000:]
    assert "removing an unfinished checkpoint save" in out and "resuming from checkpoint-4" in out
    assert CheckpointDir(run / "checkpoints").latest() == CheckpointDir(run / "checkpoints").final(8)
    return run


def test_kill_during_a_save_and_after_a_checkpoint_resumes_exactly(tmp_path, killed_after_checkpoint_8, reference):
    """The same command again resumes from checkpoint-8 and ends with the reference's weights; the
    losses of steps 5 to 8, trained after the first resume, are the reference's too."""
    run = tmp_path / "run"
    shutil.copytree(killed_after_checkpoint_8, run)
    resumed = train(run)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming from checkpoint-8" in out
    assert_resumed_exactly(run, reference, resumed_from=8)


def test_two_nodes_read_the_shards_of_two_processes_and_resume_after_a_kill_during_a_save(
    tmp_path, killed_after_checkpoint_8, reference
):
    """The killed 2-process run continued by two agents of 2 processes (2 x 2 mesh), the global batch
    still 16 (8 x 2, then 4 x 4). One byte of rank 1's optimizer shard in checkpoint-8 changed: that
    checkpoint is set aside and the run resumes from checkpoint-4, DCP reading every slice the 2
    processes wrote into the 4 processes' shards. Rank 0 killed during the save of checkpoint-12,
    both agents started again: they resume from the checkpoint-8 the 2 x 2 mesh wrote. The run must
    end with the reference's weights, which it can only if weights and AdamW moments were read right."""
    run = tmp_path / "run"
    shutil.copytree(killed_after_checkpoint_8, run)
    shard = run / "checkpoints" / "checkpoint-8" / "fsdp_optimizer" / "__1_0.distcp"
    with shard.open("r+b") as f:  # same size, one byte changed: only the sha256 can tell
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    killed = two_nodes(run, fault="save.staged@12")
    out = killed[0].stdout
    assert any(p.returncode != 0 for p in killed) and not (run / "summary.json").exists(), out[-3000:]
    assert "checkpoint-8 is not usable (fsdp_optimizer/__1_0.distcp: sha256 differs from the manifest)" in out
    assert "checkpoint-4 was written by 2 processes and this run has 4: the global batch is the same" in out
    layout = CheckpointDir(run / "checkpoints")
    assert layout.latest() == layout.final(8)
    written = read_manifest(layout.final(8))
    assert written.world_size == 4 and "fsdp_model/__3_0.distcp" in written.files

    resumed = two_nodes(run)
    assert [p.returncode for p in resumed] == [0, 0], "\n".join(p.stdout[-3000:] for p in resumed)
    assert "(node 1 of 2, local rank 1 of 2)" in resumed[1].stdout
    assert "resuming from checkpoint-8" in resumed[0].stdout
    assert_resumed_exactly(run, reference, resumed_from=8)
