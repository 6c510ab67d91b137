"""Preference pairs packed with document masks (data.packing and data.document_mask): several pairs
a row, chosen and rejected side by side, and every loss and every answer's log-probability equal to
those of the same pairs padded (to 1e-6 in float32, with SDPA, the attention a CPU run takes, and
eager); a pair longer than a block whole, the rows as long as it."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from supertune.config.objectives import OBJECTIVES
from supertune.config.schema import DataConfig, RunConfig
from supertune.config.validate import config_problems
from supertune.conversations.preference import encode_pairs, encode_unpaired
from supertune.embedded import default_tokenizer
from supertune.embedded.chat import EMBEDDED_CHAT_TEMPLATE
from supertune.embedded.preference import generate_pairs
from supertune.modeling.packed_attention import keep_packed_rows_apart
from supertune.train.preference.preference_reference import attach_reference
from supertune.train.preference.preference_scoring import batch_logps
from supertune.training_data.preference_batches import sequence_count
from supertune.training_data.preference_data import PackedPreferenceCollator, PreferenceCollator, PreferenceRows
from test_preference_losses import CASES, _model, _perturbed, _trainer

TOL = 1e-6
BLOCK = 200


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    tok.chat_template = EMBEDDED_CHAT_TEMPLATE
    return tok


LONG_PROMPT = " ".join(f"The mill by the river {i} grinds the wheat of the farms around it." for i in range(12))


def _text_pairs() -> dict[str, list]:
    """Plain-text pairs of different lengths, the last longer than BLOCK."""
    return {
        "prompt": ["The mill is", "Ada bakes", "Where is the well? It is", LONG_PROMPT],
        "chosen": [" north of the town.", " bread every morning for the whole street.", " in the square.", " old."],
        "rejected": [" under the sea.", " stones.", " on the moon, far from the square and the town.", " new."],
    }


def _rows(tokenizer, unpaired: bool) -> PreferenceRows:
    pairs = generate_pairs(5, 8)
    conversations = {k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")}
    d = DataConfig()
    if not unpaired:
        encoded = encode_pairs(conversations, d, tokenizer, "the test", 0)
        encoded += encode_pairs(_text_pairs(), d, tokenizer, "the test", len(encoded))
        return PreferenceRows([c for c, _ in encoded], [r for _, r in encoded])
    text = _text_pairs()
    rows = {
        "prompt": conversations["prompt"] + text["prompt"],
        "completion": conversations["chosen"][:4] + conversations["rejected"][4:] + text["chosen"],
        "label": [True] * 4 + [False] * 4 + [True, False, True, False],
    }
    encoded = encode_unpaired(rows, d, tokenizer, "the test", 0)
    return PreferenceRows.unpaired([a for a, _ in encoded], [label for _, label in encoded])


def _both(tokenizer, rows: PreferenceRows) -> tuple[dict, dict]:
    items = [rows[i] for i in range(len(rows))]
    padded = PreferenceCollator(tokenizer.pad_token_id)(items)
    packed = PackedPreferenceCollator(tokenizer.pad_token_id, BLOCK)(items)
    return padded, packed


def _sdpa_or_eager(tokenizer, attention: str):
    model = _model(tokenizer)
    model.set_attn_implementation(attention)
    keep_packed_rows_apart(model)  # as build_model installs it: refuses what would attend across
    return model


def test_pairs_share_rows_and_a_pair_longer_than_a_block_sets_the_rows_length(tokenizer):
    rows = _rows(tokenizer, unpaired=False)
    padded, packed = _both(tokenizer, rows)
    n = len(rows)
    lengths = [len(a.ids) for a in rows.first + rows.second]
    assert packed["sequence_lengths"].tolist() == lengths and sequence_count(packed) == 2 * n == sequence_count(padded)
    owners = packed["sequence_ids"]
    for i in range(n):  # a pair's chosen and rejected sequences share one row
        (row_chosen,) = set((owners == i).nonzero()[:, 0].tolist())
        (row_rejected,) = set((owners == n + i).nonzero()[:, 0].tolist())
        assert row_chosen == row_rejected
        assert int((owners == i).sum()) == lengths[i] and int((owners == n + i).sum()) == lengths[n + i]
    used = (owners >= 0).sum(-1)
    long_pair = lengths[n - 1] + lengths[2 * n - 1]
    # the pair longer than a block is whole in one row, and the rows are as long as it, filled up to it
    assert long_pair > BLOCK and packed["input_ids"].shape[1] == long_pair
    assert int(used.max()) <= long_pair and sum(lengths) == int(used.sum())
    assert max(len(set(owners[r].tolist()) - {-1}) for r in range(owners.shape[0])) >= 4  # two pairs or more a row
    # positions restart at 0 for every sequence; labels: the answers alone, never a sequence's first token
    starts = (packed["position_ids"] == 0) & (owners >= 0)
    assert int(starts.sum()) == 2 * n
    assert bool((packed["labels"][starts] == -100).all())
    answers = sum(int(a.mask.sum()) for a in rows.first + rows.second)
    assert int((packed["labels"] != -100).sum()) == answers == int((padded["labels"] != -100).sum())
    assert packed["input_ids"].numel() < 0.7 * padded["input_ids"].numel()  # the padding packing saves


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("unpaired", [False, True], ids=["pairs", "kto"])
def test_every_answers_logp_packed_equals_padded(tokenizer, attention, unpaired):
    model = _sdpa_or_eager(tokenizer, attention)
    padded, packed = _both(tokenizer, _rows(tokenizer, unpaired))
    for prefix in ("", "kl_") if unpaired else ("",):
        with torch.no_grad():
            alone, alone_tokens = batch_logps(model, padded, prefix)
            together, together_tokens = batch_logps(model, packed, prefix)
        assert torch.equal(alone_tokens, together_tokens)
        assert float((alone - together).abs().max()) < TOL, (alone - together).abs().max()


@pytest.mark.parametrize(("objective", "knobs"), CASES, ids=[f"{o}-{k.get('dpo_loss', '')}" for o, k in CASES])
def test_every_loss_packed_equals_padded(tmp_path, tokenizer, objective, knobs):
    """The same pairs (rows), the reference precomputed once per row with the start model, scored by
    the trainer padded and packed: the loss, its gradient's source, and every metric agree."""
    start = _sdpa_or_eager(tokenizer, "sdpa")
    policy = _perturbed(start)
    rows = _rows(tokenizer, OBJECTIVES[objective].rows == "unpaired")
    packing = PackedPreferenceCollator(tokenizer.pad_token_id, BLOCK)
    if OBJECTIVES[objective].reference:
        attach_reference(start, [rows], packing.padded(), 4, torch.device("cpu"))
    trainer = _trainer(tmp_path, policy, objective, "precomputed" if OBJECTIVES[objective].reference else None, **knobs)
    padded, packed = _both(tokenizer, rows)
    with torch.no_grad():
        alone, together = trainer.preference_loss(policy, padded), trainer.preference_loss(policy, packed)
    assert abs(float(alone.loss) - float(together.loss)) < TOL, (float(alone.loss), float(together.loss))
    assert alone.metrics.keys() == together.metrics.keys() and alone.rows == together.rows
    for name, value in alone.metrics.items():
        assert abs(float(value) - float(together.metrics[name])) < TOL, name


def test_the_reference_precomputed_per_row_matches_the_packed_start_model(tokenizer):
    """Computed once, padded, whatever the layout: the same numbers the start model gives the packed batch."""
    start = _sdpa_or_eager(tokenizer, "sdpa")
    rows = _rows(tokenizer, unpaired=False)
    packing = PackedPreferenceCollator(tokenizer.pad_token_id, BLOCK)
    assert type(packing.padded()) is PreferenceCollator
    attach_reference(start, [rows], packing.padded(), 4, torch.device("cpu"))
    batch = packing([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        live = batch_logps(start, batch)[0]
    assert float((batch["ref_logps"] - live).abs().max()) < TOL


def test_document_mask_packs_preference_rows_and_is_no_longer_refused(tmp_path, tokenizer):
    from supertune.training_data.preference_data import build_preference_data

    for name in ("dpo", "kto"):
        cfg = RunConfig()
        cfg.training.objective = name
        cfg.data.document_mask = True
        assert config_problems(cfg) == [], name
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"prompt": "p{i}", "chosen": " a", "rejected": " b c"}}\n' for i in range(8)))
    d = DataConfig(train_files=[str(pairs)], validation_split_percentage=25, document_mask=True, block_size=64)
    data = build_preference_data(d, "dpo", tokenizer, 0, 512)
    assert isinstance(data.collator, PackedPreferenceCollator) and data.collator.block_size == 64
    d.document_mask = False  # data.packing alone: padded, as before
    assert type(build_preference_data(d, "dpo", tokenizer, 0, 512).collator) is PreferenceCollator


@pytest.mark.slow
def test_a_packed_dpo_run_takes_the_padded_runs_steps(tmp_path):
    """`supertune train` with data.document_mask=true on the embedded pairs: the same losses step by
    step, the same final evaluation, as the same run padded (the same pairs in every batch)."""
    from test_preference_runs import SMALL
    from test_resume import losses, train

    runs = {}
    for name, extra in (("padded", []), ("packed", ["data.document_mask=true", "data.block_size=128"])):
        runs[name] = tmp_path / name
        proc = train(runs[name], "training.objective=dpo", "training.learning_rate=3e-3", *SMALL, *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    padded, packed = losses(runs["padded"]), losses(runs["packed"])
    assert padded.keys() == packed.keys() == {1, 2, 3, 4}
    for step, loss in padded.items():
        assert packed[step] == pytest.approx(loss, abs=1e-5), step
    summaries = {name: json.loads((run / "summary.json").read_text()) for name, run in runs.items()}
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"):
        assert summaries["packed"][key] == pytest.approx(summaries["padded"][key], abs=1e-5), key
    for key in ("train_tokens", "train_loss_tokens"):  # the tokens read that are no padding, and the answers'
        assert summaries["packed"][key] == summaries["padded"][key], key
