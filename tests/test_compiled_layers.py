"""The `compile` speed-up is exact and compiles once: the embedded model with its decoder layers
compiled trains packed, document-masked rows to eager's per-step losses, and new document boundaries
at every step compile nothing more; it composes with gradient checkpointing (every Nth layer) and
LoRA, leaves evaluation eager and the state dict's names as they were.

The first test runs inductor, the backend the speed-up uses (on CPU inductor writes and builds C++
kernels: the bulk of the test's time, less once its cache, in the system's temp directory, holds
them). The others run aot_eager, which traces the same graphs through dynamo and AOTAutograd (where
graph breaks, guards and recompiles are decided) without generating kernels, so they cost seconds.
"""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from supertune.config import ModelConfig
from supertune.config.load import build_run_config
from supertune.modeling import compiled_layers
from supertune.modeling.checkpointing import checkpointed_layers
from supertune.modeling.compiled_layers import compile_layers, compiled_layer_count
from supertune.modeling.model import build_model
from supertune.modeling.speed import RunFacts, take_speedups
from supertune.modeling.tokenizer import load_tokenizer
from supertune.training_data.document_bins import DocumentBins

ROWS, BLOCK, STEPS = 4, 64, 10


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_run_config({}))


@pytest.fixture
def backend(request, monkeypatch):
    """torch.compile's backend for one test, with dynamo's caches and counters fresh."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled_layers, "BACKEND", request.param)
    compiled_layers._compiled.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    yield request.param
    compiled_layers._compiled.cache_clear()
    torch._dynamo.reset()


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _batches(vocab: int, steps: int = STEPS) -> list[dict[str, torch.Tensor]]:
    """Packed, document-masked batches of ROWS x BLOCK: documents of 1 to 40 tokens, so that every
    row holds a boundary (a document's end, or the padding after it) and every batch its own."""
    from transformers import default_data_collator

    rng = np.random.default_rng(0)
    docs = [rng.integers(3, vocab, n).astype(np.int32) for n in rng.integers(1, 40, 14 * steps)]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    bins = DocumentBins(np.concatenate(docs), offsets, BLOCK, 0)
    assert len(bins) >= ROWS * steps
    return [default_data_collator([bins[ROWS * s + r] for r in range(ROWS)]) for s in range(steps)]


def _model(tokenizer, **model: object):
    torch.manual_seed(0)
    overrides = {"num_hidden_layers": 1, **model.pop("config_overrides", {})}  # type: ignore[dict-item]
    return build_model(ModelConfig(config_overrides=overrides, **model), tokenizer, document_mask=True).train()  # type: ignore[arg-type]


def _train(model, batches) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses of SGD steps on `batches`, and the gradients of the last step.

    Not AdamW: it divides each gradient by its own running size, so that float rounding in a gradient
    near zero (tied embedding rows of tokens absent from the batch get about 1e-8 from the output
    layer, and the two paths differ there by as much) becomes a whole learning-rate step, and the
    comparison would measure Adam's amplification instead of the compiled arithmetic."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        losses.append(loss.item())
    return losses, grads


def _same(eager: list[float], compiled: list[float], tolerance: float) -> None:
    assert len(eager) == len(compiled)
    for step, (a, b) in enumerate(zip(eager, compiled)):
        assert abs(a - b) <= tolerance * abs(a), (step, a, b)


@pytest.mark.parametrize("backend", ["inductor"], indirect=True)
def test_compiled_layers_train_to_eager_losses_and_compile_once(tokenizer, backend):
    eager = _model(tokenizer)
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    assert compiled_layer_count(compiled) == 1 and compiled_layer_count(eager) == 0
    batches = _batches(len(tokenizer))
    eager_losses, _ = _train(eager, batches)
    compiled_losses, _ = _train(compiled, batches)
    _same(eager_losses, compiled_losses, 1e-5)
    boundaries = [tuple((torch.diff(b["position_ids"], dim=-1) != 1).nonzero().flatten().tolist()) for b in batches]
    assert len(set(boundaries)) == STEPS  # each step its own document boundaries (and so its own 4-D mask)
    assert _graphs() == 1  # compiled at the first step, reused by the nine others


@pytest.mark.parametrize("backend", ["aot_eager"], indirect=True)
def test_one_graph_serves_every_layer_and_evaluation_stays_eager(tokenizer, backend):
    eager = _model(tokenizer, config_overrides={"num_hidden_layers": 3})
    compiled = copy.deepcopy(eager)
    names = list(compiled.state_dict())
    compile_layers(compiled)
    assert compiled_layer_count(compiled) == 3 and list(compiled.state_dict()) == names
    batches = _batches(len(tokenizer), 3)
    losses, grads = _train(compiled, batches)
    eager_losses, eager_grads = _train(eager, batches)
    _same(eager_losses, losses, 1e-6)
    assert max((grads[n] - eager_grads[n]).abs().max().item() for n in grads) <= 1e-6
    assert _graphs() == 1  # three layers, three steps: one graph
    compiled.eval()
    with torch.no_grad():
        compiled(**batches[0])
        compiled.generate(batches[0]["input_ids"][:1, :8], max_new_tokens=3, do_sample=False)
    assert _graphs() == 1  # evaluation and generation run the eager code


@pytest.mark.parametrize("backend", ["aot_eager"], indirect=True)
def test_compiled_layers_with_selective_checkpointing_and_lora(tokenizer, backend):
    checkpointed = {"gradient_checkpointing": True, "gradient_checkpointing_every": 2}
    eager = _model(tokenizer, config_overrides={"num_hidden_layers": 3}, **checkpointed)
    assert checkpointed_layers(eager) == [0, 2]
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    batches = _batches(len(tokenizer), 3)
    losses, grads = _train(compiled, batches)
    eager_losses, eager_grads = _train(eager, batches)
    _same(eager_losses, losses, 1e-6)
    assert max((grads[n] - eager_grads[n]).abs().max().item() for n in grads) <= 1e-6
    assert _graphs() == 2  # a checkpointed layer and a plain one
    lora = {"lora": {"enabled": True, "dropout": 0.0}}
    from supertune.config.load import build_run_config as config_of

    m = config_of({"model": {"config_overrides": {"num_hidden_layers": 2}, **lora, **checkpointed}}).model
    torch.manual_seed(0)
    eager_lora = build_model(m, tokenizer, document_mask=True).train()
    compiled_lora = copy.deepcopy(eager_lora)
    assert take_speedups(compiled_lora, "auto", ["chunked_cross_entropy"], RunFacts("ddp", "cuda")).taken == [
        "fused_adamw",
        "compile",
    ]
    assert compiled_layer_count(compiled_lora) == 2
    lora_losses, lora_grads = _train(compiled_lora, batches)
    eager_lora_losses, eager_lora_grads = _train(eager_lora, batches)
    _same(eager_lora_losses, lora_losses, 1e-6)
    assert set(lora_grads) == set(eager_lora_grads) and all("lora_" in n for n in lora_grads)
    assert max((lora_grads[n] - eager_lora_grads[n]).abs().max().item() for n in lora_grads) <= 1e-6


def test_what_leaves_compile_out_and_why():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    skip = ["chunked_cross_entropy", "fused_adamw"]
    left_out = {
        "cpu": take_speedups(llama, "auto", skip, RunFacts("ddp", "cpu")),
        "torch_compile": take_speedups(llama, "auto", skip, RunFacts("ddp", "cuda", torch_compile=True)),
        "zero3": take_speedups(llama, "auto", skip, RunFacts("zero3", "cuda")),
    }
    assert {k: c.left_out["compile"] for k, c in left_out.items()} == {
        "cpu": "CPU: compiled layers were slower than eager here, after a minute of compiling; CUDA only",
        "torch_compile": "training.torch_compile=true: the Trainer compiles the whole model already",
        "zero3": "distributed.strategy=zero3: runs under ddp and fsdp only",
    }
    assert compiled_layer_count(llama) == 0
    assert take_speedups(llama, "auto", skip, RunFacts("fsdp", "cuda")).taken == ["compile"]
    assert compiled_layer_count(llama) == 1 and llama.config.use_cache is False


FSDP_ONE_PROCESS = textwrap.dedent(
    """
    import copy, sys
    import torch
    from torch._dynamo.utils import counters
    from supertune.config.load import build_run_config
    from supertune.distributed.fsdp import mesh_shape, shard_model
    from supertune.launch.environment import launch_environment
    from supertune.modeling import compiled_layers
    from supertune.modeling.tokenizer import load_tokenizer
    sys.path.insert(0, sys.argv[1])
    from test_compiled_layers import _batches, _model, _train

    compiled_layers.BACKEND = "aot_eager"
    cfg = build_run_config({"distributed": {"strategy": "fsdp"}})
    tokenizer = load_tokenizer(cfg)
    checkpointed = {"gradient_checkpointing": True, "gradient_checkpointing_every": 2}
    eager = _model(tokenizer, config_overrides={"num_hidden_layers": 3}, **checkpointed)
    compiled = copy.deepcopy(eager)
    compiled_layers.compile_layers(compiled)
    shard_model(compiled, cfg, launch_environment())
    batches = _batches(len(tokenizer), 3)
    losses = _train(eager, batches)[0], _train(compiled, batches)[0]
    print((*losses, counters["stats"]["unique_graphs"], mesh_shape(compiled), type(compiled.model.layers[0]).__name__))
    """
)


def test_compiled_layers_under_fsdp2_with_checkpointing(tmp_path):
    """FSDP2 (fully_shard per decoder layer and the root, one process: the very path of a sharded run)
    over compiled layers, every 2nd checkpointed: eager's losses, one graph per kind of layer. FSDP2
    gives each layer a subclass; the compiled code finds its checkpointing wrapper all the same."""
    proc = subprocess.run(
        [sys.executable, "-c", FSDP_ONE_PROCESS, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    eager, compiled, graphs, mesh, layer = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert mesh == {"dp_shard": 1} and layer == "FSDPLlamaDecoderLayer"
    _same(eager, compiled, 1e-6)
    assert graphs == 2  # one for the checkpointed layers, one for the others


TRAIN_BOTH = textwrap.dedent(
    """
    import dataclasses, sys
    from supertune.cli.main import main
    from supertune.modeling import compiled_layers, speed

    compiled_layers.BACKEND = "aot_eager"  # see the module docstring
    record = speed.SPEEDUPS["compile"]
    speed.SPEEDUPS["compile"] = dataclasses.replace(
        record, unavailable=lambda model, facts: record.unavailable(model, dataclasses.replace(facts, device="cuda"))
    )
    common = sys.argv[3:]
    assert main(["train", "--run-dir", sys.argv[1], "training.speed_skip=[compile]", *common]) == 0
    assert main(["train", "--run-dir", sys.argv[2], *common]) == 0
    """
)


@pytest.mark.slow
def test_a_run_with_compiled_layers_gives_the_losses_of_eager(tmp_path):
    """`supertune train` on the embedded model with document-masked packing and gradient checkpointing
    of every 2nd layer, 4 steps: the Trainer's losses and eval loss with the layers compiled (the
    record told it runs on CUDA) equal those of the eager run."""
    import json

    eager_dir, compiled_dir = tmp_path / "eager", tmp_path / "compiled"
    settings = [
        "data.document_mask=true",
        "model.gradient_checkpointing=true",
        "model.gradient_checkpointing_every=2",
        "training.max_steps=4",
        "training.logging_steps=1",
        "training.save_strategy=no",
        "training.report_to=[]",
        "training.per_device_train_batch_size=4",
        "generate.max_new_tokens=0",
        "data.max_eval_samples=8",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN_BOTH, str(eager_dir), str(compiled_dir), *settings],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses, summaries = [], []
    for run_dir in (eager_dir, compiled_dir):
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses.append({r["step"]: r["loss"] for r in rows if "loss" in r})
        summaries.append(json.loads((run_dir / "summary.json").read_text()))
    assert len(losses[0]) == 4 and losses[0].keys() == losses[1].keys()
    _same(list(losses[0].values()), list(losses[1].values()), 1e-6)
    assert abs(summaries[1]["eval_loss"] - summaries[0]["eval_loss"]) <= 1e-6 * summaries[0]["eval_loss"]
    assert "compile" in summaries[1]["speed"]["taken"]
    assert summaries[0]["speed"]["left_out"]["compile"] == "training.speed_skip"
