"""data.document_mask is exact: packed documents give the per-token losses of the same documents run
one by one, no attention crosses a boundary, and models that would attend across are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from supertune.errors import UserError
from supertune.modeling import packed_attention
from supertune.modeling.packed_attention import VERIFIED_MODEL_TYPES, keep_packed_rows_apart, varlen_arguments
from supertune.training_data.document_bins import IGNORE_INDEX, DocumentBins, best_fit_decreasing, plan_documents

VOCAB = 64
PAD = 0
BLOCK = 32


def _documents(seed: int = 0, count: int = 14) -> list[np.ndarray]:
    """Documents of 1 to 30 tokens, and one of 75 (split into pieces of 32, 32 and 11)."""
    rng = np.random.default_rng(seed)
    lengths = [1, 2, *rng.integers(3, 31, count - 3).tolist(), 75]
    return [rng.integers(1, VOCAB, n).astype(np.int32) for n in lengths]


def _bins(docs: list[np.ndarray]) -> DocumentBins:
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return DocumentBins(np.concatenate(docs), offsets, BLOCK, PAD)


def _llama(attention: str = "sdpa"):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)


def _gpt2(attention: str = "sdpa"):
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)


def _batch(dataset, indices) -> dict[str, torch.Tensor]:
    from transformers import default_data_collator

    return default_data_collator([dataset[i] for i in indices])


# --- packing ---------------------------------------------------------------------------------------


def test_best_fit_decreasing_fills_bins_tightly_and_never_overfills():
    lengths = [5, 9, 2, 7, 7, 3, 10, 1, 6]
    bins = best_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    # 10, 9, 7, 7 and 6 need a bin each and 5 fits with none of them: 6 bins is the least possible
    assert bins == [[6], [1], [3, 2, 7], [4, 5], [8], [0]]
    assert best_fit_decreasing(lengths, 10) == bins  # deterministic


def test_every_document_whole_in_one_block_and_long_ones_in_pieces_from_position_0():
    docs = _documents()
    dataset = _bins(docs)
    plan = dataset.plan
    assert plan.documents == len(docs) and plan.split_documents == 1
    assert plan.tokens == sum(len(d) for d in docs)
    seen: list[list[int]] = []
    for b in range(len(dataset)):
        row = dataset[b]
        ids, labels, positions = row["input_ids"], row["labels"], row["position_ids"]
        assert ids.shape == labels.shape == positions.shape == (BLOCK,)
        starts = [i for i in range(BLOCK) if positions[i] == 0]
        ends = starts[1:] + [BLOCK]
        for s, e in zip(starts, ends):
            assert positions[s:e].tolist() == list(range(e - s))
            assert labels[s] == IGNORE_INDEX  # the first token of a document is never predicted from another
            piece = ids[s:e].tolist()
            if set(piece) == {PAD}:
                assert (
                    e == BLOCK and labels[s:e].eq(IGNORE_INDEX).all()
                )  # the padding: a sequence of its own, out of the loss
            else:
                assert labels[s + 1 : e].tolist() == piece[1:]
                seen.append(piece)
    long_doc = docs[-1].tolist()
    pieces = [long_doc[:32], long_doc[32:64], long_doc[64:]]
    for d in docs[:-1]:
        assert d.tolist() in seen  # short documents whole
    for p in pieces:
        assert p in seen
    assert len(seen) == len(docs) - 1 + len(pieces)
    slots = len(dataset) * BLOCK
    assert plan.padding_share == pytest.approx(1 - plan.tokens / slots)


def test_windows_pack_the_same_documents_the_same_way():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 700, 5000)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    a, b = plan_documents(offsets, 512, window=1000), plan_documents(offsets, 512, window=1000)
    assert np.array_equal(a.piece_starts, b.piece_starts) and np.array_equal(a.bin_starts, b.bin_starts)
    assert a.tokens == lengths.sum()
    assert a.padding_share < 0.02
    per_block = np.add.reduceat(a.piece_lengths, a.bin_starts[:-1])
    assert per_block.max() <= 512


# --- exactness -------------------------------------------------------------------------------------


def _piece_losses(model, dataset: DocumentBins, batch_rows: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token losses of every document piece in the packed rows, and of the same pieces run alone."""
    batch = _batch(dataset, batch_rows)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    packed, alone = [], []
    for r in range(len(batch_rows)):
        positions = batch["position_ids"][r]
        starts = (positions == 0).nonzero().flatten().tolist()
        ends = starts[1:] + [BLOCK]
        for s, e in zip(starts, ends):
            labels = batch["labels"][r, s:e]
            if e - s < 2 or labels[1:].eq(IGNORE_INDEX).all():
                continue  # the padding, or a one-token document (nothing to predict)
            ids = batch["input_ids"][r, s:e]
            packed.append(F.cross_entropy(logits[r, s : e - 1], ids[1:], reduction="none"))
            with torch.no_grad():
                own = model(input_ids=ids[None]).logits[0]
            alone.append(F.cross_entropy(own[:-1], ids[1:], reduction="none"))
    return packed, alone


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_losses_equal_the_documents_run_one_by_one(build, attention):
    model = build(attention).eval()
    assert model.config.use_cache  # the models' default; the hook turns the cache off for packed rows
    keep_packed_rows_apart(model)
    dataset = _bins(_documents())
    packed, alone = _piece_losses(model, dataset, list(range(len(dataset))))
    assert len(packed) >= 15
    worst = max((a - b).abs().max().item() for a, b in zip(packed, alone))
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_a_changed_token_of_one_document_leaves_the_others_logits_identical(build):
    """Fails if attention crossed a boundary: a document's logits depend only on its own tokens."""
    model = build().eval()
    keep_packed_rows_apart(model)
    docs = [np.arange(1, 11, dtype=np.int32), np.arange(20, 32, dtype=np.int32), np.arange(40, 47, dtype=np.int32)]
    changed = [docs[0].copy(), *docs[1:]]
    changed[0][3] = 60
    rows = []
    for variant in (docs, changed):
        dataset = _bins(variant)
        assert len(dataset) == 1  # all three in one block
        batch = _batch(dataset, [0])
        with torch.no_grad():
            rows.append((batch, model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]))
    (before, a), (after, b) = rows
    other = (before["input_ids"][0] != after["input_ids"][0]).nonzero().flatten().tolist()
    assert len(other) == 1
    starts = (before["position_ids"][0] == 0).nonzero().flatten().tolist()
    doc_of = np.searchsorted(starts, np.arange(BLOCK), side="right") - 1
    changed_doc = doc_of[other[0]]
    same = torch.from_numpy(doc_of != changed_doc)
    assert torch.equal(a[same], b[same])
    assert not torch.equal(a[~same], b[~same])  # the changed document itself does change
    # the same rows without the hook and with the model's cache on would attend across documents
    plain = build().eval()
    with torch.no_grad():
        leaked_a = plain(input_ids=before["input_ids"], position_ids=before["position_ids"]).logits[0]
        leaked_b = plain(input_ids=after["input_ids"], position_ids=after["position_ids"]).logits[0]
    later = same & (torch.arange(BLOCK) > other[0])
    assert not torch.equal(leaked_a[later], leaked_b[later])


def test_training_mode_with_dropout_off_matches_too():
    """In training the Trainer calls the model in train mode; dropout aside, nothing changes."""
    model = _gpt2()
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(model.config, name, 0.0)
    model = type(model)(model.config).train()
    keep_packed_rows_apart(model)
    dataset = _bins(_documents(2))
    packed, alone = _piece_losses(model, dataset, [0, 1, 2])
    assert max((a - b).abs().max().item() for a, b in zip(packed, alone)) <= 1e-5


# --- which models keep the rows apart --------------------------------------------------------------


def _tiny(model_type: str):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    sizes = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "head_dim": 8,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
    }
    for key, value in sizes.items():
        if hasattr(config, key):
            setattr(config, key, value)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if hasattr(config, key):
            setattr(config, key, PAD)
    if getattr(config, "sliding_window", None):
        config.sliding_window = 4096
    return config


def _models(model_type: str):
    """The model with each verified attention implementation it supports (gemma2 has no SDPA path)."""
    from transformers import AutoModelForCausalLM

    built = []
    for attention in packed_attention.MASKED_ATTENTION:
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(
                _tiny(model_type), attn_implementation=attention, dtype=torch.float32
            )
        except ValueError as exc:
            assert "does not support" in str(exc)
            continue
        built.append(model.eval())
    assert built
    return built


@pytest.mark.parametrize("model_type", VERIFIED_MODEL_TYPES)
def test_every_verified_model_type_keeps_documents_apart(model_type):
    dataset = _bins(_documents(3, count=8))
    for model in _models(model_type):
        keep_packed_rows_apart(model)
        packed, alone = _piece_losses(model, dataset, list(range(len(dataset))))
        worst = max((a - b).abs().max().item() for a, b in zip(packed, alone))
        assert worst <= 1e-5, (model.config._attn_implementation, worst)


@pytest.mark.parametrize("model_type", ["opt", "bloom"])
def test_a_model_that_attends_across_documents_is_refused(model_type):
    """OPT takes its positions from the attention mask and BLOOM uses ALiBi: packed rows would silently leak."""
    model = _models(model_type)[-1]
    dataset = _bins(_documents(3, count=8))
    fullest = int(np.argmax(np.diff(dataset.plan.bin_starts)))  # the block with the most documents
    batch = _batch(dataset, [fullest])
    packed, alone = _piece_losses(model, dataset, [fullest])
    assert max((a - b).abs().max().item() for a, b in zip(packed, alone)) > 1e-3  # what the refusal prevents
    keep_packed_rows_apart(model)
    with pytest.raises(UserError, match=rf"data.document_mask: model type '{model_type}' is not verified"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    with torch.no_grad():  # other batches are left alone
        model(input_ids=batch["input_ids"], attention_mask=torch.ones_like(batch["input_ids"]))


# --- flash attention's variable-length arguments ---------------------------------------------------


def test_varlen_arguments_bound_every_document_of_the_flattened_batch():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    args = varlen_arguments(positions)
    assert args["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 12] and args["cu_seq_lens_q"].dtype == torch.int32
    assert args["max_length_q"] == args["max_length_k"] == 6
    assert varlen_arguments(torch.tensor([[1, 2, 3]])) is None


def _reference_varlen(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Variable-length attention by its definition: causal attention within each [cu[i], cu[i+1]) of the flattened batch."""
    batch, heads, length, dim = query.shape
    given = kwargs.get("cu_seq_lens_q")
    bounds = given.tolist() if given is not None else list(range(0, batch * length + 1, length))
    groups = heads // key.shape[1]
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.repeat_interleave(groups, dim=1).transpose(1, 2).reshape(batch * length, heads, dim)
    v = value.repeat_interleave(groups, dim=1).transpose(1, 2).reshape(batch * length, heads, dim)
    out = torch.empty_like(q)
    for lo, hi in zip(bounds, bounds[1:]):
        seg = F.scaled_dot_product_attention(
            q[lo:hi].transpose(0, 1), k[lo:hi].transpose(0, 1), v[lo:hi].transpose(0, 1), is_causal=True, scale=scaling
        )
        out[lo:hi] = seg.transpose(0, 1)
    return out.reshape(batch, length, heads, dim), None


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_flash_attention_gets_the_document_boundaries_of_a_multi_row_batch(build, monkeypatch):
    """No GPU here: a reference variable-length attention, registered as transformers registers flash
    attention, shows that the hook's boundaries reach the attention of every layer and keep rows apart."""
    from transformers import AttentionInterface

    AttentionInterface.register("supertune_varlen_reference", _reference_varlen)
    monkeypatch.setattr(packed_attention, "_is_flash", lambda name: name == "supertune_varlen_reference")
    model = build("sdpa").eval()
    model.set_attn_implementation("supertune_varlen_reference")
    keep_packed_rows_apart(model)
    dataset = _bins(_documents())
    packed, alone = _piece_losses(model, dataset, list(range(len(dataset))))
    assert max((a - b).abs().max().item() for a, b in zip(packed, alone)) <= 1e-5
