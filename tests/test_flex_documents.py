"""flex_document_mask is exact: document-masked packed rows through flex attention give the per-token
losses of the documents run alone and of today's SDPA block mask; training with it gives SDPA's
per-step losses; new document boundaries do not recompile the kernel; auto takes it only where it
can run and says why not elsewhere.

PyTorch's flex_attention refuses a backward pass on CPU in its public function (`_validate_device`);
the dense reference it runs there, the one its compiled kernels are tested against, has one. The
training test lifts that refusal to follow the gradients on CPU; nothing in supertune does.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from supertune.modeling import flex_documents
from supertune.modeling.flex_documents import ATTENTION, FLEX_MODEL_TYPES, document_block_mask, use_flex_documents
from supertune.modeling.packed_attention import keep_packed_rows_apart
from supertune.modeling.speed import RunFacts, take_speedups
from test_packing_exact import _batch, _bins, _documents, _llama, _piece_losses, _tiny

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # flex_attention uncompiled on CPU says so once


def _both(model_type: str):
    """The same model twice, as SDPA builds it and switched to flex attention for packed rows (without
    a sliding window, which mistral's and starcoder2's configs may set and which keeps flex out)."""
    from transformers import AutoModelForCausalLM

    config = _tiny(model_type)
    if hasattr(config, "sliding_window"):
        config.sliding_window = None
    built = []
    for flex in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        keep_packed_rows_apart(model.eval())
        if flex:
            assert flex_documents.flex_unfit_reason(model) is None
            use_flex_documents(model)
        built.append(model)
    return built


@pytest.mark.parametrize("model_type", FLEX_MODEL_TYPES)
def test_flex_losses_equal_the_documents_alone_and_the_sdpa_block_mask(model_type):
    sdpa, flex = _both(model_type)
    assert flex.config._attn_implementation == ATTENTION
    dataset = _bins(_documents(3, count=8))
    rows = list(range(len(dataset)))
    packed, alone = _piece_losses(flex, dataset, rows)
    assert len(packed) >= 8
    assert max((a - b).abs().max().item() for a, b in zip(packed, alone)) <= 1e-5
    batch = _batch(dataset, rows)
    with torch.no_grad():
        through_sdpa = sdpa(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
        through_flex = flex(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
    assert abs(through_flex.loss.item() - through_sdpa.loss.item()) <= 1e-5 * through_sdpa.loss.item()
    assert (through_flex.logits - through_sdpa.logits).abs().max().item() <= 1e-5


def test_the_block_mask_is_causal_within_each_document_and_the_padding_its_own():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    mask = document_block_mask(positions)
    query, key = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    first = mask.mask_mod(torch.tensor(0), torch.tensor(0), query, key)
    documents = torch.tensor([0, 0, 0, 1, 1, 2, 3, 4])  # 0 after 0: a new document, as transformers reads it
    assert torch.equal(first, (query >= key) & (documents[query] == documents[key]))
    assert torch.equal(mask.mask_mod(torch.tensor(1), torch.tensor(0), query, key), query >= key)


def test_other_calls_run_sdpa_as_before():
    """Padded batches and generation with a cache carry no block mask and keep SDPA's path and numbers."""
    sdpa, flex = _both("llama")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    padding = (ids != 0).long()
    with torch.no_grad():
        assert torch.equal(
            sdpa(input_ids=ids, attention_mask=padding).logits, flex(input_ids=ids, attention_mask=padding).logits
        )
    prompt = torch.tensor([[5, 6, 7]])
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(sdpa.generate(prompt, **settings), flex.generate(prompt, **settings))


def test_new_document_boundaries_do_not_recompile_flex_attention(monkeypatch):
    """The boundaries are data: rows of 384 tokens (3 x 128-token tiles) split differently each batch
    run through one compiled graph. The backend is dynamo's counter (a graph per compilation); the
    guards that decide recompiling are dynamo's whichever backend compiles."""
    from torch._dynamo.testing import CompileCounter
    from torch.nn.attention.flex_attention import flex_attention

    counter = CompileCounter()
    compiled = torch.compile(flex_attention, backend=counter)
    monkeypatch.setattr(flex_documents, "_flex_attention", lambda device_type: compiled)
    _, model = _both("llama")
    generator = torch.Generator().manual_seed(0)
    layouts = set()
    for _ in range(4):
        rows = []
        for _ in range(2):
            row: list[int] = []
            while len(row) < 384:
                row += list(range(int(torch.randint(5, 60, (1,), generator=generator))))
            rows.append(row[:384])
        positions = torch.tensor(rows)
        layouts.add(tuple(document_block_mask(positions).kv_num_blocks.flatten().tolist()))
        with torch.no_grad():
            model(input_ids=torch.randint(1, 64, (2, 384), generator=generator), position_ids=positions)
    assert len(layouts) > 1  # the tiles the masks keep differ between batches
    assert counter.frame_count == 1  # every layer of every batch reused the first compilation


def test_auto_takes_it_for_document_masked_packing_on_cuda_only_and_says_why_not():
    from peft import LoraConfig, get_peft_model

    cuda = RunFacts("ddp", "cuda", document_mask=True)
    left = {
        "plain packing": (_llama(), RunFacts("ddp", "cuda")),
        "cpu": (_llama(), RunFacts("ddp", "cpu", document_mask=True)),
        "gpt2": (_sdpa_model("gpt2"), cuda),
        "eager": (_llama("eager"), cuda),
        "window": (_sdpa_model("mistral"), cuda),
    }
    why = {
        name: take_speedups(model, "auto", [], facts).left_out["flex_document_mask"]
        for name, (model, facts) in left.items()
    }
    assert why == {
        "plain packing": "data.document_mask=false: only document-masked packing has a block mask to use",
        "cpu": "CPU: flex attention trains on CUDA only",
        "gpt2": "model type 'gpt2' is not verified with flex attention",
        "eager": "attention 'eager': replaces sdpa only",
        "window": "sliding-window attention (sliding_window=4096): the document mask here has no window",
    }
    dropout = _llama()
    dropout.config.attention_dropout = 0.1
    assert flex_documents.flex_unfit_reason(dropout) == "attention_dropout=0.1: flex attention has no dropout"
    taken = take_speedups(_llama(), "auto", [], dataclasses.replace(cuda, strategy="fsdp"))
    assert taken.taken == ["flex_document_mask", "compile"]
    lora = get_peft_model(_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert "flex_document_mask" in take_speedups(lora, "auto", [], cuda).taken
    assert lora.base_model.model.config._attn_implementation == ATTENTION


def _sdpa_model(model_type: str):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(_tiny(model_type), attn_implementation="sdpa", dtype=torch.float32)


TRAIN_BOTH = textwrap.dedent(
    """
    import dataclasses, sys
    import torch.nn.attention.flex_attention as flex
    from supertune.cli.main import main
    from supertune.modeling import speed

    flex._validate_device = lambda query, key, value: None  # see the test module's docstring
    record = speed.SPEEDUPS["flex_document_mask"]
    speed.SPEEDUPS["flex_document_mask"] = dataclasses.replace(
        record, unavailable=lambda model, facts: record.unavailable(model, dataclasses.replace(facts, device="cuda"))
    )
    common = sys.argv[3:]
    assert main(["train", "--run-dir", sys.argv[1], "training.speed_skip=[flex_document_mask]", *common]) == 0
    assert main(["train", "--run-dir", sys.argv[2], *common]) == 0
    """
)


def test_training_with_flex_gives_the_losses_of_the_sdpa_block_mask(tmp_path: Path):
    """The embedded model, document-masked packing, 3 steps: SDPA's block mask, then flex attention."""
    sdpa_dir, flex_dir = tmp_path / "sdpa", tmp_path / "flex"
    settings = [
        "data.packing=true",
        "data.document_mask=true",
        "training.max_steps=3",
        "training.logging_steps=1",
        "training.save_strategy=no",
        "training.report_to=[]",
        "training.per_device_train_batch_size=4",
        "generate.max_new_tokens=0",
        "data.max_eval_samples=8",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN_BOTH, str(sdpa_dir), str(flex_dir), *settings],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses, summaries = [], []
    for run_dir in (sdpa_dir, flex_dir):
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses.append({r["step"]: r["loss"] for r in rows if "loss" in r})
        summaries.append(json.loads((run_dir / "summary.json").read_text()))
    sdpa, flex = losses
    assert len(sdpa) == 3 and sdpa.keys() == flex.keys()
    for step, loss in sdpa.items():
        assert abs(flex[step] - loss) <= 1e-5 * abs(loss), (step, loss, flex[step])
    assert abs(summaries[1]["eval_loss"] - summaries[0]["eval_loss"]) <= 1e-5 * summaries[0]["eval_loss"]
    assert "flex_document_mask" in summaries[1]["speed"]["taken"]
    assert summaries[0]["speed"]["left_out"]["flex_document_mask"] == "training.speed_skip"


def test_gradients_equal_sdpa_with_gradient_checkpointing(monkeypatch):
    """Training mode, recomputed layers: every parameter's gradient as with SDPA's block mask."""
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(flex, "_validate_device", lambda query, key, value: None)  # see the module docstring
    dataset = _bins(_documents(4))
    batch = _batch(dataset, list(range(len(dataset))))
    gradients = []
    for model in _both("llama"):
        model.gradient_checkpointing_enable()
        model.train()
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"]).loss.backward()
        gradients.append({name: p.grad for name, p in model.named_parameters()})
    sdpa, through_flex = gradients
    assert sdpa.keys() == through_flex.keys()
    for name, grad in sdpa.items():
        assert (through_flex[name] - grad).abs().max().item() <= 1e-5 * max(1.0, grad.abs().max().item()), name
