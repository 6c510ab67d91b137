"""Conversations through the run paths plain text has: `--nproc 2` (torchrun over gloo) under DDP, FSDP
and ZeRO-3, exact resume after a SIGKILL, a two-site federation; and the tokens a run trained on (the
loss targets), counted over the very batches, in the checkpoint manifests, the summary and the
federation's round table."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

from supertune.checkpoints.layout import CheckpointDir
from supertune.checkpoints.manifest import read_manifest
from test_resume import assert_same_weights, losses, train

pytestmark = pytest.mark.slow

# One epoch of 32 embedded conversations, padded (one a row), 8 a step: every conversation is trained
# exactly once, whatever the order, so the loss targets can be counted from the data alone.
CONVERSATIONS, STEPS, MAX_LENGTH = 32, 4, 128
CHAT = [
    "data.format=chat",
    "data.packing=false",
    f"data.max_length={MAX_LENGTH}",
    f"data.max_train_samples={CONVERSATIONS}",
    "data.max_eval_samples=16",
    "model.config_overrides=num_hidden_layers=1",
    f"training.max_steps={STEPS}",
    "training.save_steps=2",
    "training.report_to=[]",
]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("chat") / "straight"
    proc = train(run, *CHAT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"the loss on {_summary(run)['train_loss_tokens']} of them" in proc.stdout
    # Some conversations are longer than a row: kept, truncated, and counted in the log.
    assert f"training conversations are longer than {MAX_LENGTH} tokens: each is truncated at" in proc.stderr
    return run


def _targets_in_one_epoch() -> tuple[int, int]:
    """(loss targets, tokens) of the first CONVERSATIONS training conversations as padding trains them:
    each truncated to MAX_LENGTH, its mask shifted by one (position 0 predicts nothing)."""
    from transformers import AutoTokenizer

    from supertune.config.schema import DataConfig
    from supertune.conversations.encoding import encode_rows
    from supertune.embedded import chat_corpus, default_tokenizer
    from supertune.embedded.chat import EMBEDDED_CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    tokenizer.chat_template = EMBEDDED_CHAT_TEMPLATE
    lines = chat_corpus().train.read_text().splitlines()[:CONVERSATIONS]
    rows = {"messages": [json.loads(line)["messages"] for line in lines]}
    ids, masks = encode_rows(rows, DataConfig(format="chat"), tokenizer, "the test", 0)
    targets = sum(int(np.sum(m[1:MAX_LENGTH])) for m in masks)
    return targets, sum(min(len(x), MAX_LENGTH) for x in ids)


def test_the_loss_tokens_are_the_answers_of_the_batches_trained(straight):
    summary = _summary(straight)
    targets, tokens = _targets_in_one_epoch()
    assert (summary["train_tokens"], summary["train_loss_tokens"]) == (tokens, targets)
    assert 0 < targets < tokens // 2  # the answers are the smaller part of a conversation
    layout = CheckpointDir(straight / "checkpoints")
    half, final = (read_manifest(path) for _, path in layout.published())
    assert (final.step, final.loss_tokens, final.tokens_seen) == (STEPS, targets, tokens)
    assert 0 < half.loss_tokens < final.loss_tokens and half.loss_tokens < half.tokens_seen


# Two processes of 4 conversations a step each: the global batch of the one-process runs.
TWO = [*CHAT, "training.per_device_train_batch_size=4"]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    """The two-process DDP run of the same conversations, which the sharding strategies are compared with."""
    run = tmp_path_factory.mktemp("chat") / "two"
    proc = train(run, *TWO, nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _summary(run)["sharding"]["wrapper"] == "DistributedDataParallel"
    return run


def test_two_processes_train_the_same_answers_as_one(straight, two):
    one, both = _summary(straight), _summary(two)
    assert both["world_size"] == 2 and both["loss_on"] == "assistant"
    assert (both["train_tokens"], both["train_loss_tokens"]) == (one["train_tokens"], one["train_loss_tokens"])
    ref, got = losses(straight), losses(two)
    assert ref.keys() == got.keys() and max(abs(ref[s] - got[s]) for s in ref) <= 1e-4
    assert abs(one["eval_loss"] - both["eval_loss"]) <= 1e-4


@pytest.mark.parametrize(("strategy", "wrapper"), [("fsdp", "FSDP"), ("zero3", "DeepSpeedEngine")])
def test_a_sharded_run_trains_the_answers_ddp_trains(two, tmp_path, strategy, wrapper):
    """FSDP and ZeRO-3, which shard the parameters too, receive the batches DDP receives, labels
    included: the same per-step losses and eval loss in fp32, the same loss tokens."""
    run = tmp_path / strategy
    proc = train(run, *TWO, "generate.max_new_tokens=0", f"distributed.strategy={strategy}", nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp, sharded = _summary(two), _summary(run)
    assert sharded["sharding"]["wrapper"].startswith(wrapper) and sharded["loss_on"] == "assistant"
    assert 0.45 <= sharded["sharding"]["held_fraction"] <= 0.55  # each process holds half of every parameter
    assert (sharded["train_tokens"], sharded["train_loss_tokens"]) == (ddp["train_tokens"], ddp["train_loss_tokens"])
    ref, got = losses(two), losses(run)
    worst = max(abs(ref[s] - got[s]) for s in ref)
    print(f"{strategy} vs ddp: per-step loss {worst:.1e}, eval loss {abs(ddp['eval_loss'] - sharded['eval_loss']):.1e}")
    assert ref.keys() == got.keys() and worst <= 1e-5
    assert abs(ddp["eval_loss"] - sharded["eval_loss"]) <= 1e-5
    # the loss tokens of both processes, summed when the sharded checkpoint is written
    final = read_manifest(CheckpointDir(run / "checkpoints").final(STEPS))
    assert final.loss_tokens == sharded["train_loss_tokens"]


def test_a_killed_chat_run_resumes_to_the_same_weights_and_loss_tokens(straight, tmp_path):
    run = tmp_path / "run"
    killed = train(run, *CHAT, fault="step@3")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    resumed = train(run, *CHAT)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from checkpoint-2" in resumed.stdout + resumed.stderr
    assert_same_weights(run, straight)
    summary = _summary(run)
    assert summary["resumed_from_step"] == 2
    assert summary["train_loss_tokens"] == _summary(straight)["train_loss_tokens"]
    assert read_manifest(CheckpointDir(run / "checkpoints").final(STEPS)).loss_tokens == summary["train_loss_tokens"]


def test_a_federation_of_chat_sites_reports_each_sites_loss_tokens(tmp_path):
    from supertune.embedded.chat import generate_conversations
    from supertune.federation.run import federate

    sites = []
    for i, name in enumerate(("site-a", "site-b")):
        files = {}
        for split, seed, n in (("train", 100 + i, 64), ("validation", 200 + i, 8)):
            files[split] = tmp_path / f"{name}-{split}.jsonl"
            files[split].write_text(
                "".join(json.dumps({"messages": m}) + "\n" for m in generate_conversations(seed, n))
            )
        sites.append({"name": name, "steps_per_round": 2,
                      "overrides": ["data.format=chat", f"data.train_files={files['train']}",
                                    f"data.validation_files={files['validation']}", "generate.max_new_tokens=0",
                                    "training.report_to=[]", "training.warmup_steps=0"]})  # fmt: skip
    config = {"name": "fed-chat", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 1, "sites": sites}
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    fed = tmp_path / "fed"
    federate(str(tmp_path / "federation.yaml"), str(fed))  # `supertune federate`'s code, in this process
    rows = json.loads((fed / "rounds.json").read_text())["rows"]
    assert [r["site"] for r in rows] == ["site-a", "site-b"]
    markdown = (fed / "rounds.md").read_text()
    for row in rows:
        trained = json.loads((fed / "round-001" / row["site"] / "trained.json").read_text())
        manifest = read_manifest(Path(trained["checkpoint"]))
        assert row["loss_tokens"] == trained["loss_tokens"] == manifest.loss_tokens
        assert 0 < row["loss_tokens"] < row["tokens"] // 2  # packed conversations: the answers alone
        assert f"| 1 | {row['site']} | {row['tokens']:,} | {row['loss_tokens']:,} |" in markdown
        site_summary = json.loads((Path(trained["run"]) / "summary.json").read_text())
        assert site_summary["loss_on"] == "assistant"
