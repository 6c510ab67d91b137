"""The FLOP count (supertune.telemetry.flops) against hand-derived counts of published models and
against torch's FlopCounterMode on a real forward + backward; the peak table and the MFU arithmetic.

Hand-derived counts are written the way a reader checks them: the weights one token multiplies
with (q, k, v, o, the MLP, the output projection once), times 2 FLOPs per multiply-accumulate, plus
the attention scores 4 x S x heads x head_dim per layer; training is 3x that forward.
"""

from __future__ import annotations

import pytest

from supertune.telemetry.flops import FORMULA, UnsupportedModel, architecture, flop_count, model_matmul_weights
from supertune.telemetry.meter import Window, throughput_figures
from supertune.telemetry.peaks import PEAKS, choose_peak, compute_dtype

LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
GPT2_SMALL = {
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "vocab_size": 50257,
    "tie_word_embeddings": True,
}
OPT_125M = {
    "model_type": "opt",
    "hidden_size": 768,
    "ffn_dim": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
    "tie_word_embeddings": True,
}
OPT_350M = {
    "model_type": "opt",
    "hidden_size": 1024,
    "ffn_dim": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "vocab_size": 50272,
    "word_embed_proj_dim": 512,
    "tie_word_embeddings": True,
}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
                "num_experts_per_tok": 2, "tie_word_embeddings": False}  # fmt: skip


def _gpt2_names(config: dict) -> dict:
    """GPT-2's config.json names, as transformers' attribute_map reads them."""
    names = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads"}
    return {names.get(k, k): v for k, v in config.items()}


def test_llama2_7b_by_hand():
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008  # q, k, v, o (32 KV heads: full size) + gate, up, down
    weights = 32 * per_layer + 4096 * 32000  # + the output projection
    attention = 32 * 4 * 4096 * 4096  # layers x 4 x S x (heads x head_dim) at S = 4096
    c = flop_count(architecture(LLAMA2_7B), 4096)
    assert c.forward == 2 * weights + attention == 15_361_638_400
    assert c.training == 3 * c.forward == 46_084_915_200
    # The same as PaLM's 6N + 12·L·H·Q·T with N the non-embedding weights plus the head.
    assert c.training == 6 * weights + 12 * 32 * 4096 * 4096


def test_grouped_query_attention_llama3_8b_by_hand():
    attention_proj = 4096 * 4096 + 2 * 4096 * (8 * 128) + 4096 * 4096  # q, then k and v with 8 KV heads of 128, then o
    per_layer = attention_proj + 3 * 4096 * 14336
    weights = 32 * per_layer + 4096 * 128256
    c = flop_count(architecture(LLAMA3_8B), 8192)
    assert c.forward == 2 * weights + 32 * 4 * 8192 * 4096 == 19_304_284_160
    mha = flop_count(architecture(dict(LLAMA3_8B, num_key_value_heads=32)), 8192)
    assert mha.forward - c.forward == 32 * 2 * 2 * 4096 * (32 - 8) * 128  # k and v of 24 more heads, nothing else


def test_gpt2_small_by_hand_tied_embeddings_counted_once():
    per_layer = 4 * 768 * 768 + 2 * 768 * 3072  # c_attn (q, k, v) + c_proj; c_fc + c_proj (n_inner: 4 x 768)
    weights = 12 * per_layer + 768 * 50257  # the tied output projection, once; the lookups cost no FLOPs
    c = flop_count(architecture(_gpt2_names(GPT2_SMALL)), 1024)
    assert c.forward == 2 * weights + 12 * 4 * 1024 * 768 == 284_812_800
    untied = flop_count(architecture(dict(_gpt2_names(GPT2_SMALL), tie_word_embeddings=False)), 1024)
    assert untied.forward == c.forward  # tying changes parameters, not FLOPs


def test_opt_by_hand_with_and_without_the_embedding_projection():
    small = flop_count(architecture(OPT_125M), 2048)
    assert (
        small.forward == 2 * (12 * (4 * 768 * 768 + 2 * 768 * 3072) + 768 * 50272) + 12 * 4 * 2048 * 768 == 322_584_576
    )
    # OPT-350m: 512-wide embeddings, projected in to 1024 and out again before a 512-wide head.
    weights = 24 * (4 * 1024 * 1024 + 2 * 1024 * 4096) + 512 * 1024 + 1024 * 512 + 512 * 50272
    big = flop_count(architecture(OPT_350M), 2048)
    assert big.forward == 2 * weights + 24 * 4 * 2048 * 1024 == 858_882_048


def test_mixture_of_experts_counts_the_router_and_top_k_experts():
    per_layer = (
        (2 * 4096 * 4096 + 2 * 4096 * 1024) + 4096 * 8 + 2 * 3 * 4096 * 14336
    )  # attention, router, 2 of 8 experts
    c = flop_count(architecture(MIXTRAL_8X7B), 4096)
    assert c.forward == 2 * (32 * per_layer + 4096 * 32000) + 32 * 4 * 4096 * 4096 == 27_644_657_664
    assert architecture(MIXTRAL_8X7B).matmul_weights() > 40e9  # every expert's weights: 46.7B in all


def test_training_multipliers():
    arch = architecture(LLAMA2_7B)
    plain, recompute = flop_count(arch, 4096), flop_count(arch, 4096, recompute=True)
    assert recompute.training == plain.training  # MFU counts the model's FLOPs, not the recomputation
    head = 2 * 4096 * 32000
    assert recompute.hardware == 4 * plain.forward - head  # the layers again; the head is not checkpointed
    lora = flop_count(arch, 4096, frozen_weights=True)
    assert lora.training == 2 * (plain.forward - plain.attention_scores) + 3 * plain.attention_scores
    assert (
        FORMULA in plain.describe()
        and "3x forward" in plain.describe()
        and "gradient checkpointing" in recompute.describe()
    )


def test_unsupported_models_are_named():
    with pytest.raises(UnsupportedModel, match="multi-head latent attention"):
        architecture({"model_type": "deepseek_v3", "kv_lora_rank": 512, "num_hidden_layers": 2, "hidden_size": 64,
                      "num_attention_heads": 4, "vocab_size": 100})  # fmt: skip
    with pytest.raises(UnsupportedModel, match="does not give"):
        architecture({"model_type": "mystery"})


# ---- against the models themselves ---------------------------------------------------------------

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 128}


def _tiny_configs() -> dict:
    import transformers as T

    return {
        "llama-gqa": T.LlamaConfig(**TINY, num_key_value_heads=2),
        "gpt2": T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128),
        "opt-projected": T.OPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=96, vocab_size=128, word_embed_proj_dim=32),
        "mixtral": T.MixtralConfig(**TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        "qwen2-moe": T.Qwen2MoeConfig(**TINY, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=48, decoder_sparse_step=2),
        "gemma": T.GemmaConfig(**TINY, num_key_value_heads=1, head_dim=32),
    }  # fmt: skip


def _measured(config, gradient_checkpointing: bool, batch: int = 2, seq: int = 32) -> float:
    """Matmul FLOPs of one forward + backward, counted by torch as it runs (eager attention: plain bmm)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # a loop of F.linear over the chosen experts, which torch counts
    model.train()
    if gradient_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.config.use_cache = False
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "opt-projected", "mixtral", "qwen2-moe", "gemma"])
def test_training_flops_match_flop_counter_mode(name):
    config = _tiny_configs()[name]
    measured = _measured(config, gradient_checkpointing=False)
    expected = flop_count(architecture(config), 32).training * 2 * 32
    assert measured == pytest.approx(expected, rel=0.02), (measured, expected)


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_hardware_flops_with_gradient_checkpointing_match_flop_counter_mode(name):
    config = _tiny_configs()[name]
    measured = _measured(config, gradient_checkpointing=True)
    expected = flop_count(architecture(config), 32, recompute=True).hardware * 2 * 32
    # torch's recomputation stops once the backward has what it needs, so a layer's last matmul
    # may not run again: the count is an upper bound, within a few percent.
    assert 0.95 * expected <= measured <= expected * 1.0001, (measured, expected)


def test_the_config_reading_matches_the_built_models_of_many_types():
    """Architecture.matmul_weights() equals the matmul weights of the model transformers builds,
    for every model type in the table that builds from a small config: a wrong MLP guess, KV head
    count or head width would show here."""
    import torch
    import transformers as T

    small = dict(TINY, pad_token_id=0)
    configs = [
        T.LlamaConfig(**small, num_key_value_heads=2), T.MistralConfig(**small, num_key_value_heads=2),
        T.Qwen2Config(**small, num_key_value_heads=2), T.Qwen3Config(**small, num_key_value_heads=2, head_dim=32),
        T.GemmaConfig(**small, num_key_value_heads=1, head_dim=32), T.Gemma2Config(**small, num_key_value_heads=2, head_dim=16),
        T.Phi3Config(**small, num_key_value_heads=2), T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128),
        T.OPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=96, vocab_size=128, word_embed_proj_dim=32),
        T.GPTNeoXConfig(**small), T.MixtralConfig(**small, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        T.Qwen3MoeConfig(**small, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        T.FalconConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128),
        T.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128),
        T.GPTBigCodeConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128), T.Starcoder2Config(**small, num_key_value_heads=2),
        T.PhiConfig(**small), T.Olmo2Config(**small), T.GPTJConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128, rotary_dim=8),
        T.GraniteConfig(**small), T.SmolLM3Config(**small, num_key_value_heads=2), T.Glm4Config(**small, num_key_value_heads=2, head_dim=16),
    ]  # fmt: skip
    checked = []
    for config in configs:
        with torch.device("meta"):
            model = T.AutoModelForCausalLM.from_config(config)
        assert architecture(config).matmul_weights() == model_matmul_weights(model), config.model_type
        checked.append(config.model_type)
    assert len(set(checked)) == 22, checked


def test_an_unknown_model_type_is_fitted_to_the_built_model():
    import torch
    import transformers as T

    from supertune.telemetry.flops import fit_to_model

    config = T.GemmaConfig(**TINY, num_key_value_heads=1, head_dim=32, hidden_act="gelu_pytorch_tanh")
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(config)
    config.model_type = "some_new_gemma"  # not in the table; its activation suggests two matrices
    guessed = architecture(config)
    assert not guessed.gated_mlp and guessed.assumed
    fitted, problem = fit_to_model(guessed, model)
    assert fitted.gated_mlp and problem is None and "from the model's weights" in fitted.assumed


# ---- peaks and MFU -----------------------------------------------------------------------------


class _Profile:
    def __init__(self, name: str, peak: float) -> None:
        self.name, self.peak_bf16_tflops_per_gpu = name, peak


@pytest.mark.parametrize(("device", "dtype", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 NVL", "bf16", 835.5),
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA GH200 480GB", "bf16", 989.4), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100-PCIE-40GB", "fp16", 312.0), ("NVIDIA A100-SXM4-40GB", "tf32", 156.0), ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
    ("AMD Instinct MI250X", "bf16", 191.5), ("AMD Instinct MI300X", "bf16", 1307.4), ("Tesla V100-SXM2-32GB", "fp16", 125.0),
])  # fmt: skip
def test_the_table_gives_dense_peaks_by_device_and_dtype(device, dtype, tflops):
    choice = choose_peak(device, dtype)
    assert choice.tflops == tflops and "dense" in choice.source


def test_no_table_figure_is_a_sparse_one():
    # Datasheets lead with figures "with sparsity", twice the dense ones (H100 SXM 1,979 bf16):
    # every row says how its dense figure was read.
    for row in PEAKS:
        assert "dense" in row.source or "halved" in row.source, row.name
    assert max(p.tflops.get("bf16", 0) for p in PEAKS if "H100" in p.name) < 1000


def test_the_profile_comes_first_and_a_mismatch_is_said():
    choice = choose_peak("NVIDIA A100-SXM-64GB", "bf16", _Profile("leonardo", 312))
    assert choice.tflops == 312 and "cluster profile leonardo" in choice.source and choice.warning is None
    wrong = choose_peak("NVIDIA H100 80GB HBM3", "bf16", _Profile("oldsite", 312))
    assert wrong.tflops == 312 and "989.4" in wrong.warning  # the profile wins, loudly
    # The profile's figure is a half-precision tensor peak: never the denominator of an fp32 run.
    assert choose_peak("NVIDIA A100-SXM4-40GB", "fp32", _Profile("karolina", 312)).tflops == 19.5
    assert choose_peak("Some Future GPU", "fp32", _Profile("x", 500)).tflops is None


def test_cpu_and_unknown_devices_have_no_peak():
    cpu = choose_peak(None, "fp32")
    assert cpu.tflops is None and cpu.source.startswith("CPU") and "no MFU" in cpu.source
    assert choose_peak("Some Future GPU", "bf16").tflops is None
    assert choose_peak("Tesla V100-SXM2-32GB", "bf16").tflops is None  # no bf16 tensor cores


def test_compute_dtype():
    assert compute_dtype("bf16", "fp32", False) == "bf16"
    assert compute_dtype("no", "bf16", False) == "bf16"
    assert (compute_dtype("no", "fp32", True), compute_dtype("no", "fp32", False)) == ("tf32", "fp32")


def test_mfu_divides_per_device_flops_by_one_device_peak():
    """8 devices, 4 micro-batches accumulated per step: tokens are the step's, over all devices."""
    c = flop_count(architecture(LLAMA2_7B), 4096)
    # Two optimizer steps of 8 devices x 4 micro-batches x 1 sequence of 4096 tokens, 2 s each.
    window = Window()
    for _ in range(2):
        window.add(seconds=2.0, wait_s=0.1, tokens=8 * 4 * 4096)
    figures = throughput_figures(window, world_size=8, count=c, peak_tflops=989.4)
    assert figures["tokens_per_step"] == 8 * 4 * 4096
    assert figures["throughput_tokens_per_s"] == 8 * 4 * 4096 / 2.0
    per_device = 4 * 4096 / 2.0 * c.training / 1e12
    assert figures["tflops_per_device"] == pytest.approx(per_device)
    assert figures["mfu"] == pytest.approx(per_device / 989.4)
    assert 0 < figures["mfu"] < 1 and figures["data_wait_share"] == pytest.approx(0.05)
    assert "hfu" not in figures
    assert "mfu" not in throughput_figures(window, 8, c, None)  # no peak (CPU): no MFU at all


def test_the_step_clock_splits_data_wait_from_compute():
    """On a clock the test advances itself, so that the figures are exact however loaded the machine
    is: each step waits 0.03 s for data and computes 0.06 s; 0.2 s of logging and saving between steps
    is no step's time."""
    from types import SimpleNamespace

    from supertune.telemetry.callback import StepClock

    now = [100.0]
    clock, state = StepClock(clock=lambda: now[0]), SimpleNamespace(num_input_tokens_seen=0)
    clock.on_train_begin(None, state, None)
    for _ in range(3):
        now[0] += 0.03  # the Trainer fetching the step's batches
        clock.on_step_begin(None, state, None)
        now[0] += 0.06  # forward, backward, optimizer
        state.num_input_tokens_seen += 100
        clock.on_step_end(None, state, None)
        clock.on_log(None, state, None)
        now[0] += 0.2  # logging, evaluation, saving: no step's time
        clock.on_save(None, state, None)
    window = clock.take_window()
    assert window.steps == 3 and window.tokens == 300
    assert window.seconds == pytest.approx(0.27) and window.wait_s == pytest.approx(0.09)  # 1/3 waited for data
    run = clock.run_window()  # the run's figures leave the first (warm-up) step out
    assert run.steps == 2 and run.seconds == pytest.approx(0.18) and run.tokens == 200


def test_a_gpu_run_names_its_peak_and_warns_once_above_100_percent(caplog):
    """No GPU here: the telemetry of a 16-GPU run, built from its parts, as the training process builds it."""
    import logging

    from supertune.launch.environment import LaunchEnvironment
    from supertune.telemetry.callback import Telemetry

    count = flop_count(architecture(LLAMA3_8B), 8192, recompute=True)
    device = "NVIDIA H100 80GB HBM3"
    telemetry = Telemetry(
        count, None, choose_peak(device, "bf16"), device, LaunchEnvironment(world_size=16, num_nodes=2)
    )
    line = telemetry.plan_line()
    assert line.startswith(
        f"devices 16 x {device} on 2 nodes; FLOPs per token 57.9 GFLOP (training = 3 x 19.3 GFLOP forward"
    )
    assert "MFU against 989.4 TFLOP/s per device (NVIDIA H100 SXM bf16 dense" in line
    window = Window()
    window.add(seconds=1.0, wait_s=0.0, tokens=16 * 8000)  # 8,000 tokens per device per second
    figures = telemetry.figures(window)
    assert figures["mfu"] == pytest.approx(8000 * count.training / 1e12 / 989.4)  # about 47 %
    assert figures["hfu"] > figures["mfu"]
    caplog.set_level(logging.WARNING, logger="supertune")
    impossible = Window()
    impossible.add(seconds=1.0, wait_s=0.0, tokens=16 * 40000)
    assert telemetry.figures(impossible)["mfu"] > 1 and telemetry.figures(impossible)["mfu"] > 1
    warnings = [r.getMessage() for r in caplog.records if "above 100 %" in r.getMessage()]
    assert len(warnings) == 1 and "989.4 TFLOP/s" in warnings[0]  # said once, naming the peak
