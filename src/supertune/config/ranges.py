"""Upper bounds and ranges of config values, as far as what consumes them accepts.

The typed build already refuses a float that is not finite and an integer beyond 64 bits; here are
the narrower limits of the libraries and systems the values go to, so that a value past them is one
line naming the key instead of an OverflowError, a MemoryError or a billion processes later.
"""

from __future__ import annotations

from .schema import RunConfig

__all__ = ["SEED_MAX", "NAME_MAX_BYTES", "OPTIMIZERS", "range_problems", "seed_problems", "within_range"]

SEED_MAX = 2**32 - 1
"""numpy's legacy seed (what transformers' set_seed seeds besides torch) takes 0 .. 2**32 - 1."""
NAME_MAX_BYTES = 200
"""output.name plus "-YYYYmmdd-HHMMSS-N" must fit the 255 bytes most file systems allow a name."""
_LIMITS = {
    # key: (largest value, what it is and why)
    "launch.nproc": (1024, "processes on one machine"),
    "training.per_device_train_batch_size": (2**20, "sequences per process and forward pass"),
    "training.per_device_eval_batch_size": (2**20, "sequences per process and forward pass"),
    "training.gradient_accumulation_steps": (2**20, "forward passes per optimizer step"),
    "training.global_batch_size": (2**24, "sequences per optimizer step"),
    "training.dataloader_num_workers": (256, "worker processes per data loader"),
    "training.ddp_timeout": (2**31 - 1, "seconds (68 years)"),
    "model.lora.r": (65536, "a rank above the model's width adds nothing"),
    "model.tokenizer_vocab_size": (2**31 - 1, "token ids are 32-bit"),
    "data.block_size": (2**31 - 1, "token positions are 32-bit"),
    "data.max_length": (2**31 - 1, "token positions are 32-bit"),
}

OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor", "adamw_anyprecision",
    "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit",
    "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw",
    "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
    "lomo", "adalomo", "grokadamw", "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd", "apollo_adamw",
    "apollo_adamw_layerwise", "stable_adamw",
)  # fmt: skip
"""training.optim values of the pinned transformers (its OptimizerNames; a test keeps the two equal).
Written out so that checking a config imports no transformers; several need extra packages
(bitsandbytes, galore-torch, ...), which the Trainer names when it creates the optimizer."""


def within_range(key: str, value: int | float | None) -> bool:
    """Whether `value` is within the upper bound of `key` (keys without one always are)."""
    return value is None or key not in _LIMITS or value <= _LIMITS[key][0]


def seed_problems(key: str, value: int | None) -> list[str]:
    """The line for a seed that torch and numpy cannot take (none for an unset one)."""
    if value is not None and not 0 <= value <= SEED_MAX:
        return [f"{key}: {value} is not a seed; use 0 .. {SEED_MAX} (2**32 - 1)"]
    return []


def range_problems(cfg: RunConfig) -> list[str]:
    """One line per value out of its range, naming the key, the value and the range."""
    p: list[str] = []
    for key, value in (
        ("training.seed", cfg.training.seed),
        ("training.data_seed", cfg.training.data_seed),
    ):  # generate.seed: validate_generate
        p += seed_problems(key, value)
    for key, (most, why) in _LIMITS.items():
        section, name = key.rsplit(".", 1)
        value = getattr(_section(cfg, section), name)
        if value is not None and value > most:
            p.append(f"{key}: {value} is above {most} ({why})")
    name_bytes = len(cfg.output.name.encode("utf-8", "surrogatepass"))
    if name_bytes > NAME_MAX_BYTES:
        p.append(
            f"output.name: {name_bytes} bytes long; a run directory's name allows at most {NAME_MAX_BYTES} (with its timestamp, 255)"
        )
    if cfg.training.optim not in OPTIMIZERS:
        p.append(
            f"training.optim: {cfg.training.optim!r} is not an optimizer transformers knows{_close(cfg.training.optim)}; e.g. adamw_torch, adamw_torch_fused, sgd"
        )
    return p


def _section(cfg: RunConfig, dotted: str) -> object:
    obj: object = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _close(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, OPTIMIZERS, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
