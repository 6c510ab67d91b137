"""Your own DeepSpeed config (distributed.deepspeed_config) and single settings (distributed.deepspeed).

The result is built in this order: the file (or, without one, the config supertune generates), the
single settings over it, then what must agree with the run, which supertune fills where the file
leaves it out or says "auto" and checks where the file gives a value:

| DeepSpeed key | must equal |
| --- | --- |
| train_micro_batch_size_per_gpu, gradient_accumulation_steps | training.per_device_train_batch_size, training.gradient_accumulation_steps |
| train_batch_size | training.global_batch_size (then left out: DeepSpeed derives it, for any process count) |
| gradient_clipping | training.max_grad_norm |
| bf16.enabled, fp16.enabled | training.bf16, training.fp16 |
| optimizer.params lr, betas, eps, weight_decay | training.learning_rate, adam_beta1/2, adam_epsilon, weight_decay |
| zero_optimization.stage | distributed.strategy |
| zero_optimization.offload_optimizer/offload_param device | distributed.offload |
| zero_optimization.stage3_gather_16bit_weights_on_model_save (ZeRO-3) | true while output.save_model (model/ is a gathered Hugging Face model) |

Everything else in the file is the user's and is passed on as written. A value that differs is one
problem naming both values and both ways out; the merged result is checked by DeepSpeed's own
config classes (`checks`) and written to the run directory (RunDir.deepspeed_config).

No torch or deepspeed import here: this runs on login nodes too.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from ..config.errors import ConfigError
from ..config.overrides import deep_merge
from ..config.schema import RunConfig
from ..errors import first_line

__all__ = ["read_deepspeed_file", "settings_tree", "user_deepspeed_config", "ZERO_KEYS"]

AUTO = "auto"

ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "overlap_comm", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "offload_param", "offload_optimizer", "sub_group_size", "cpu_offload",
    "cpu_offload_param", "cpu_offload_use_pin_memory", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
    "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance",
    "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_allgather_sequential", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "log_trace_cache_warnings", "elastic_checkpoint", "load_from_fp32_weights",
    "parameter_alignment", "leaf_module", "compute_grad_norm", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory",
    "zenflow",
})  # fmt: skip
"""Names of DeepSpeed's ZeRO options (its DeepSpeedZeroConfig fields and their aliases; a test compares
them): a single setting with one of these names goes into zero_optimization."""

_GATHER_KEYS = (
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
)


def read_deepspeed_file(path: str) -> dict[str, Any]:
    """The mapping in a DeepSpeed JSON or YAML file (YAML read as strictly as run configs:
    config/yaml_file); a ConfigError naming the file when it cannot be read."""
    key = "distributed.deepspeed_config"
    if path.endswith((".yaml", ".yml")):
        from ..config.yaml_file import read_yaml_mapping

        return _numbers(read_yaml_mapping(Path(path).expanduser(), key, "DeepSpeed settings"))
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError([f"{key}: cannot read {path!r}: {exc.strerror or exc}"]) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        first = first_line(exc)
        raise ConfigError([f"{key}: {path!r} is not valid JSON: {first}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{key}: {path!r} must hold a mapping of DeepSpeed settings, got {type(data).__name__}"])
    return data


def settings_tree(settings: dict[str, Any]) -> dict[str, Any]:
    """distributed.deepspeed as DeepSpeed's nesting: a ZeRO option name goes into zero_optimization,
    a dotted name (zero_optimization.overlap_comm, bf16.enabled) into its section."""
    tree: dict[str, Any] = {}
    for name, value in settings.items():
        parts = str(name).split(".")
        if len(parts) == 1 and parts[0] in ZERO_KEYS:
            parts = ["zero_optimization", *parts]
        node: dict[str, Any] = {}
        leaf = node
        for part in parts[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[parts[-1]] = _numbers(value)
        tree = deep_merge(tree, node)
    return tree


def user_deepspeed_config(
    cfg: RunConfig, generated: dict[str, Any], offload_target: Any, offload_optimizer: dict[str, Any]
) -> dict[str, Any]:
    """The DeepSpeed config of a zero run that has distributed.deepspeed_config or distributed.deepspeed:
    the file (else `generated`), the single settings over it, then what must agree with the run.
    `offload_target(cfg)` gives an offload section as supertune writes it, `offload_optimizer` the
    optimizer section ZeRO-Offload needs. ConfigError lists every conflict."""
    dist = cfg.distributed
    base = read_deepspeed_file(dist.deepspeed_config) if dist.deepspeed_config else copy.deepcopy(generated)
    settings = settings_tree(dist.deepspeed)
    config = deep_merge(base, settings)
    problems: list[str] = _misspelt_settings(dist.deepspeed)

    def agree(path: str, run_key: str, run_value: Any) -> None:
        """ "auto" when absent (the Trainer fills it from the same training section); else it must equal the run's value."""
        parent, leaf = _parent(config, path)
        value = parent.get(leaf, AUTO)
        if value == AUTO:
            parent[leaf] = AUTO
        elif not _equal(value, run_value):
            problems.append(_conflict(path, value, run_key, run_value, dist.deepspeed_config, settings))

    t = cfg.training
    agree("train_micro_batch_size_per_gpu", "training.per_device_train_batch_size", t.per_device_train_batch_size)
    agree("gradient_accumulation_steps", "training.gradient_accumulation_steps", t.gradient_accumulation_steps)
    agree("gradient_clipping", "training.max_grad_norm", t.max_grad_norm)
    _precision(config, cfg, agree)
    if isinstance(config.get("optimizer"), dict):
        agree("optimizer.params.lr", "training.learning_rate", t.learning_rate)
        agree("optimizer.params.betas", "training.adam_beta1/adam_beta2", [t.adam_beta1, t.adam_beta2])
        agree("optimizer.params.eps", "training.adam_epsilon", t.adam_epsilon)
        agree("optimizer.params.weight_decay", "training.weight_decay", t.weight_decay)
    _train_batch(config, cfg, settings, problems)
    _zero(config, cfg, offload_target, offload_optimizer, settings, problems)
    for key in ("steps_per_print", "wall_clock_breakdown"):  # supertune's quiet logging, unless the file says otherwise
        config.setdefault(key, generated[key])
    if problems:
        raise ConfigError(problems)
    return config


def _misspelt_settings(settings: dict[str, Any]) -> list[str]:
    """A single setting close to a ZeRO option's name is a typo: at the top level DeepSpeed would ignore it."""
    import difflib

    problems = []
    for name in settings:
        if "." in str(name) or name in ZERO_KEYS:
            continue
        close = difflib.get_close_matches(str(name), sorted(ZERO_KEYS), n=1, cutoff=0.85)
        if close:
            problems.append(
                f"distributed.deepspeed.{name}: not a ZeRO option (did you mean {close[0]}?); DeepSpeed would ignore it "
                "as a top-level key"
            )
    return problems


def _precision(config: dict[str, Any], cfg: RunConfig, agree: Any) -> None:
    t = cfg.training
    if "bfloat16" in config and "bf16" not in config:  # DeepSpeed's other name for the same section
        config["bf16"] = config.pop("bfloat16")
    for section, enabled, key in (("bf16", t.bf16, "training.bf16"), ("fp16", t.fp16, "training.fp16")):
        if not isinstance(config.get(section), dict):
            config[section] = {}
        agree(f"{section}.enabled", key, enabled)


def _train_batch(config: dict[str, Any], cfg: RunConfig, settings: dict[str, Any], problems: list[str]) -> None:
    """train_batch_size is the global batch: it must be training.global_batch_size's, and is then left out,
    since DeepSpeed derives it from the per-device batch, accumulation and process count."""
    value = config.pop("train_batch_size", AUTO)
    if value == AUTO:
        return
    g = cfg.training.global_batch_size
    if g is None:
        where = "distributed.deepspeed.train_batch_size" if "train_batch_size" in settings else _file(cfg)
        problems.append(
            f"{where}: train_batch_size is {value!r}; set training.global_batch_size={value} instead (supertune splits it "
            "over the processes into the per-device batch and accumulation) and remove it"
        )
    elif not _equal(value, g):
        problems.append(
            _conflict(
                "train_batch_size", value, "training.global_batch_size", g, cfg.distributed.deepspeed_config, settings
            )
        )


def _zero(
    config: dict[str, Any],
    cfg: RunConfig,
    offload_target: Any,
    offload_optimizer: dict[str, Any],
    settings: dict[str, Any],
    problems: list[str],
) -> None:
    dist = cfg.distributed
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        zero = config["zero_optimization"] = {}
    stage = int(dist.strategy[-1])
    if "stage" not in zero:
        zero["stage"] = stage
    elif not _equal(zero["stage"], stage):
        problems.append(
            _conflict(
                "zero_optimization.stage",
                zero["stage"],
                "distributed.strategy",
                dist.strategy,
                dist.deepspeed_config,
                settings,
                f"zero{zero['stage']}",
            )
        )
    sections = ["offload_optimizer"] + (["offload_param"] if stage == 3 else [])
    for section in sections:
        given = zero.get(section)
        device = given.get("device", "none") if isinstance(given, dict) else "none"
        if dist.offload == "none" and device == "none":
            continue
        if device == "none":
            zero[section] = offload_target(cfg)
        elif device != dist.offload:
            problems.append(
                _conflict(
                    f"zero_optimization.{section}.device",
                    device,
                    "distributed.offload",
                    dist.offload,
                    dist.deepspeed_config,
                    settings,
                    device,
                )
            )
    if dist.offload != "none" and "optimizer" not in config:
        # ZeRO-Offload steps DeepSpeed's CPU AdamW (see deepspeed_json); the Trainer's hyper-parameters fill it.
        config["optimizer"] = copy.deepcopy(offload_optimizer)
    if stage == 3:
        present = [k for k in _GATHER_KEYS if k in zero]
        if not present:
            zero[_GATHER_KEYS[0]] = True
        elif cfg.output.save_model and zero[present[0]] is not True:
            problems.append(
                f"{_where('zero_optimization.' + present[0], dist.deepspeed_config, settings)}: {present[0]} is "
                f"{zero[present[0]]!r}, but the final model (output.save_model) is saved by gathering the ZeRO-3 "
                "weights; remove it (supertune sets it to true) or set output.save_model=false"
            )


def _parent(config: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    *sections, leaf = path.split(".")
    node = config
    for section in sections:
        if not isinstance(node.get(section), dict):
            node[section] = {}
        node = node[section]
    return node, leaf


def _equal(value: Any, run_value: Any) -> bool:
    if isinstance(run_value, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(run_value, bool) and value == run_value
    if isinstance(run_value, list):
        return (
            isinstance(value, list)
            and len(value) == len(run_value)
            and all(_equal(a, b) for a, b in zip(value, run_value))
        )
    if isinstance(run_value, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(run_value)
    return value == run_value


def _file(cfg: RunConfig) -> str:
    return f"distributed.deepspeed_config ({cfg.distributed.deepspeed_config})"


def _where(path: str, file: str | None, settings: dict[str, Any]) -> str:
    """Who set `path`: a single setting (distributed.deepspeed.NAME) or the file."""
    node: Any = settings
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"distributed.deepspeed_config ({file})" if file else f"distributed.deepspeed.{path}"
        node = node[part]
    return f"distributed.deepspeed.{path}"


def _conflict(
    path: str, value: Any, run_key: str, run_value: Any, file: str | None, settings: dict[str, Any], fix: Any = None
) -> str:
    shown = run_value if not isinstance(run_value, bool) else str(run_value).lower()
    wanted = fix if fix is not None else (str(value).lower() if isinstance(value, bool) else value)
    return (
        f"{_where(path, file, settings)}: {path} is {value!r}, but {run_key} is {shown}; remove it there "
        f"(supertune fills it from {run_key}) or set {run_key}={wanted}"
    )


def _numbers(value: Any) -> Any:
    """YAML 1.1 reads 1e7 as text: numbers written that way become numbers (integers when whole)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.strip() and value != AUTO:
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "inf" not in value.lower() else number
    return value
