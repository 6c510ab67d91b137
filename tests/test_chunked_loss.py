"""The chunked output layer + cross-entropy equals the model's own loss, and its gradients, to 1e-6 in float32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from supertune.modeling.chunked_loss import chunked_linear_cross_entropy, unfit_reason, use_chunked_loss


def _inputs(rows=37, hidden=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, dtype=torch.float32, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[::5] = -100  # ignored targets, as at document starts and padding
    return h, w, t


@pytest.mark.parametrize("num_items", [None, 29.0])
@pytest.mark.parametrize("chunk_rows", [1, 4, 37, 1000])
def test_the_chunked_loss_and_its_gradients_equal_the_full_ones(num_items, chunk_rows):
    h, w, t = _inputs()
    loss = chunked_linear_cross_entropy(h, w, t, num_items, chunk_elements=chunk_rows * w.shape[0])
    gh, gw = torch.autograd.grad(loss * 3.0, (h, w))  # an upstream gradient other than 1
    reduction = "mean" if num_items is None else "sum"
    full = F.cross_entropy(F.linear(h, w).float(), t, ignore_index=-100, reduction=reduction)
    if num_items is not None:
        full = full / num_items
    fh, fw = torch.autograd.grad(full * 3.0, (h, w))
    assert abs(loss.item() - full.item()) <= 1e-6
    assert torch.allclose(gh, fh, atol=1e-6, rtol=0) and torch.allclose(gw, fw, atol=1e-6, rtol=0)


def test_only_the_gradients_asked_for_are_made():
    h, w, t = _inputs()
    w.requires_grad_(False)
    loss = chunked_linear_cross_entropy(h, w, t, chunk_elements=8 * w.shape[0])
    (gh,) = torch.autograd.grad(loss, (h,))
    (fh,) = torch.autograd.grad(F.cross_entropy(F.linear(h, w), t), (h,))
    assert torch.allclose(gh, fh, atol=1e-6, rtol=0)


def _tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _packed_batch():
    """Two rows of 24 tokens, each packing documents kept apart by their position ids, labels -100
    at every document's first token (as data.document_mask makes them)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (2, 24), generator=g)
    positions = torch.tensor([list(range(10)) + list(range(14)), list(range(5)) + list(range(19))])
    labels = ids.clone()
    labels[positions == 0] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def _loss_and_grads(model, batch, **extra):
    model.zero_grad()
    out = model(**batch, **extra)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("extra", [{}, {"num_items_in_batch": torch.tensor(41)}])
def test_a_model_with_the_chunked_loss_trains_as_with_its_own(extra):
    own = _tiny_llama()
    chunked = copy.deepcopy(own)
    use_chunked_loss(chunked)
    batch = _packed_batch()
    loss_own, grads_own = _loss_and_grads(own, batch, **extra)
    loss_chunked, grads_chunked = _loss_and_grads(chunked, batch, **extra)
    assert abs(loss_own.item() - loss_chunked.item()) <= 1e-6
    assert grads_own.keys() == grads_chunked.keys() and len(grads_own) > 10
    for name, grad in grads_own.items():
        assert torch.allclose(grad, grads_chunked[name], atol=1e-6, rtol=0), name


def test_evaluation_and_generation_run_the_models_own_code():
    own = _tiny_llama()
    chunked = copy.deepcopy(own)
    use_chunked_loss(chunked)
    batch = _packed_batch()
    with torch.no_grad():
        a, b = own(**batch), chunked(**batch)
    assert b.logits is not None and torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    prompt = batch["input_ids"][:1, :5]
    assert torch.equal(
        own.generate(prompt, max_new_tokens=4, do_sample=False),
        chunked.generate(prompt, max_new_tokens=4, do_sample=False),
    )
    # Training without labels (a caller that wants the logits) gets them.
    assert chunked(input_ids=batch["input_ids"]).logits.shape == (2, 24, 96)


def test_lora_adapters_train_as_with_the_models_own_loss():
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    own = get_peft_model(_tiny_llama(), config)
    for p in own.parameters():  # adapters start at B = 0; move them so that their gradients mean something
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    chunked = copy.deepcopy(own)
    assert unfit_reason(chunked) is None
    use_chunked_loss(chunked)
    batch = _packed_batch()
    loss_own, grads_own = _loss_and_grads(own, batch)
    loss_chunked, grads_chunked = _loss_and_grads(chunked, batch)
    assert abs(loss_own.item() - loss_chunked.item()) <= 1e-6
    assert len(grads_own) == 8 and grads_own.keys() == grads_chunked.keys()
    for name, grad in grads_own.items():
        assert torch.allclose(grad, grads_chunked[name], atol=1e-6, rtol=0), name


def test_models_it_does_not_fit_are_named_with_the_reason():
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    assert "model type 'gpt2' is not one of" in unfit_reason(gpt2)
    head_lora = get_peft_model(_tiny_llama(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert "LoRA on lm_head" in unfit_reason(head_lora)
    assert unfit_reason(_tiny_llama()) is None
