"""The numbers that differ between the GPU checklist on a lent GPU and its dry run on CPU (the
same checks, the tiny embedded model, a few steps): one record each, GPU and DRY."""

from __future__ import annotations

from dataclasses import dataclass

# ~1 B parameters with the embedded ~1,540-token vocabulary: 20 layers x (4 h^2 attention +
# 3 h x 5632 MLP) at h = 2048 is 1.007 B; block 2048, batch 4 (8,192 tokens a step).
LLAMA_1B = "hidden_size=2048,intermediate_size=5632,num_hidden_layers=20,num_attention_heads=16,num_key_value_heads=16,max_position_embeddings=2048"
TINY_FROM_CONFIG = "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=2,max_position_embeddings=256"


@dataclass
class Sizes:
    """The numbers that differ between a GPU run and the dry run."""

    quick: list[str]  # added to the embedded-default, FSDP, ZeRO and kill-and-resume runs
    steps: int  # throughput and attention runs
    model: str  # config_overrides of the throughput model
    block: int
    batch: int
    save_steps: int  # ZeRO runs: a checkpoint every save_steps of 2 x save_steps
    bf16_tolerance: float
    zero_precision: list[str]  # transformers refuses DeepSpeed in bf16 without a GPU
    evaluation: list[str]  # added to every run that evaluates (the reload's `supertune eval` reads the run's settings)
    resume: tuple[int, int, int]  # kill and resume: steps, a checkpoint every N, SIGKILL at step
    memory_most: int  # the memory check: the largest per-device batch tried (0: not run)


GPU = Sizes(
    quick=[],
    steps=20,
    model=LLAMA_1B,
    block=2048,
    batch=4,
    save_steps=10,
    bf16_tolerance=1e-2,
    zero_precision=["training.bf16=true"],
    evaluation=[],
    resume=(12, 4, 6),
    memory_most=64,
)
DRY = Sizes(
    # A quarter of the default's batch: on CPU, bf16 autocast steps of 16 sequences took 9 s each
    # under load, and the dry run checks code paths, not numbers.
    quick=["training.max_steps=4", "training.per_device_train_batch_size=4", "generate.max_new_tokens=4"],
    steps=4,
    model=TINY_FROM_CONFIG,
    block=128,
    batch=2,
    save_steps=2,
    bf16_tolerance=1e-2,
    zero_precision=[],
    # The whole validation split is 251 sequences, evaluated by 9 of the dry run's processes (each
    # reload too); 32 of them prove the path.
    evaluation=["data.max_eval_samples=32"],
    # Half the GPU form's steps: bf16 autocast steps are slow on CPU, and at 12 + 6 + 8 steps the
    # check's three runs took half of the dry run's time; at 6 + 3 + 4 the run still resumes from a
    # checkpoint written before the kill.
    resume=(6, 2, 3),
    # Filling a CPU's memory proves nothing about a GPU's and would take minutes; the search itself
    # is tested with a stand-in for the runs (tests/test_gpu_checklist.py).
    memory_most=0,
)


__all__ = ["DRY", "GPU", "LLAMA_1B", "TINY_FROM_CONFIG", "Sizes"]
