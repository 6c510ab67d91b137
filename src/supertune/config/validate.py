"""Cross-field and filesystem checks of a typed RunConfig, all collected into one ConfigError.

These checks need nothing but the config and the file system. Those that need a cluster profile, a
model's own config or DeepSpeed run after them, in `supertune.resolve.checks`.
"""

from __future__ import annotations

import glob
import math
import os
import string

from ..byte_sizes import byte_size_problem, parse_byte_size
from ..file_formats import FORMATS, expand_files, file_format
from .errors import ConfigError
from .job_values import memory_problem, sbatch_option_problem, slurm_name_problem, time_problem, time_seconds
from .objective_checks import objective_config_problems
from .ranges import range_problems, seed_problems
from .schema import DataConfig, FsdpConfig, GenerateConfig, RunConfig
from .speed_pieces import SPEED_PIECES

__all__ = ["validate", "validate_generate", "config_problems"]


REPORT_SINKS = ("tensorboard", "wandb", "mlflow", "none")
"""training.report_to's names; "none" is the Trainer's spelling of []."""


def validate(cfg: RunConfig) -> None:
    """Raise one ConfigError listing every problem of `cfg`; return None when it is sound."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError(problems)


def config_problems(cfg: RunConfig) -> list[str]:
    """Every problem of `cfg` that the config alone shows, one line each; empty when sound."""
    problems: list[str] = []
    _check_sizes(cfg, problems)
    _check_model(cfg, problems)
    _check_data(cfg, problems)
    _check_training(cfg, problems)
    _check_launch(cfg, problems)
    _check_slurm(cfg, problems)
    problems += range_problems(cfg)
    return problems


def _positive(problems: list[str], field: str, value: float | None, fix: str = "", allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        problems.append(f"{field}: must be positive, got {value}{fix}")


def _check_sizes(cfg: RunConfig, p: list[str]) -> None:
    d, t, g = cfg.data, cfg.training, cfg.generate
    _positive(p, "data.block_size", d.block_size, " (tokens per packed sequence, e.g. 512)")
    _positive(p, "data.max_length", d.max_length)
    _positive(p, "data.shuffle_buffer", d.shuffle_buffer)
    _positive(p, "data.max_train_samples", d.max_train_samples)
    _positive(p, "data.max_eval_samples", d.max_eval_samples)
    _positive(p, "training.per_device_train_batch_size", t.per_device_train_batch_size)
    _positive(p, "training.per_device_eval_batch_size", t.per_device_eval_batch_size)
    _positive(p, "training.gradient_accumulation_steps", t.gradient_accumulation_steps)
    _positive(
        p,
        "training.global_batch_size",
        t.global_batch_size,
        " (sequences per optimizer step over all processes, e.g. 16)",
    )
    _positive(p, "training.learning_rate", t.learning_rate)
    _positive(p, "training.logging_steps", t.logging_steps)
    _positive(p, "training.save_steps", t.save_steps)
    _positive(p, "training.eval_steps", t.eval_steps)
    _positive(p, "training.save_total_limit", t.save_total_limit)
    _positive(p, "training.num_train_epochs", t.num_train_epochs)
    _positive(p, "training.ddp_timeout", t.ddp_timeout)
    _positive(p, "launch.nproc", cfg.launch.nproc, " (processes on this machine)")
    _positive(
        p, "output.progress_seconds", cfg.output.progress_seconds, " (seconds between progress lines in a log, e.g. 30)"
    )
    _positive(p, "model.lora.r", cfg.model.lora.r)
    _positive(p, "model.lora.alpha", cfg.model.lora.alpha)
    if t.max_steps == 0 or t.max_steps < -1:
        p.append(
            f"training.max_steps: must be a positive number of steps or -1 (use num_train_epochs), got {t.max_steps}"
        )
    for name in ("warmup_steps", "weight_decay", "max_grad_norm", "adam_epsilon", "dataloader_num_workers"):
        if getattr(t, name) < 0:
            p.append(f"training.{name}: must not be negative, got {getattr(t, name)}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(t, name) < 1:
            p.append(f"training.{name}: must be in [0, 1), got {getattr(t, name)}")
    if not 0 <= cfg.model.lora.dropout < 1:
        p.append(f"model.lora.dropout: must be in [0, 1), got {cfg.model.lora.dropout}")
    _check_generate(g, p)
    _check_evaluation(cfg, p)
    if cfg.model.tokenizer_vocab_size < 300:
        p.append(
            f"model.tokenizer_vocab_size: a byte-level tokenizer needs at least 300 entries, got {cfg.model.tokenizer_vocab_size}"
        )
    name = cfg.output.name
    # A backslash would also switch off Slurm's %j in the job's log file names.
    if not name or name in (".", "..") or any(c in name for c in "/\\\0\n\r"):
        p.append(f"output.name: {name!r} cannot name a directory; use letters, digits, '-', '_' or '.'")


def validate_generate(g: GenerateConfig) -> None:
    """Raise a ConfigError for bad generation settings (used by `supertune generate` alone)."""
    problems: list[str] = []
    _check_generate(g, problems)
    if problems:
        raise ConfigError(problems)


def _check_generate(g: GenerateConfig, p: list[str]) -> None:
    _positive(p, "generate.temperature", g.temperature)
    if g.max_new_tokens < 0:
        p.append(f"generate.max_new_tokens: must not be negative, got {g.max_new_tokens}")
    if g.top_k < 0:
        p.append(f"generate.top_k: must not be negative (0 disables it), got {g.top_k}")
    p += seed_problems("generate.seed", g.seed)


def _check_evaluation(cfg: RunConfig, p: list[str]) -> None:
    e = cfg.evaluation
    _positive(p, "evaluation.every_steps", e.every_steps, " (optimizer steps between benchmark runs)")
    _positive(p, "evaluation.limit", e.limit, " (documents per task, e.g. 100)")
    _positive(p, "evaluation.batch_size", e.batch_size)
    if any(not t.strip() or "," in t for t in e.tasks):
        p.append(
            f"evaluation.tasks: {e.tasks!r} holds an empty name or a comma; give a list, e.g. [supertune_corpus, hellaswag]"
        )
    if e.every_steps is not None and not e.tasks:
        p.append(
            "evaluation.every_steps: there are no evaluation.tasks to run; name them, e.g. evaluation.tasks=[supertune_corpus]"
        )
    if e.every_steps is not None and cfg.distributed.strategy in ("zero3", "fsdp"):
        p.append(
            f"evaluation.every_steps: distributed.strategy={cfg.distributed.strategy} shards the parameters, so no process "
            "holds the model to evaluate during training; drop every_steps (the tasks still run on the saved model after training)"
        )
    if e.tasks and cfg.distributed.strategy in ("zero3", "fsdp") and not cfg.output.save_model:
        p.append(
            f"evaluation.tasks: under distributed.strategy={cfg.distributed.strategy} the tasks run on the saved model; "
            "set output.save_model=true"
        )


def _check_model(cfg: RunConfig, p: list[str]) -> None:
    m = cfg.model
    pretrained = m.name_or_path is not None and not m.from_config
    if m.config_overrides and pretrained:
        p.append(
            "model.config_overrides: only applies to a model built from its config; set model.from_config=true "
            "(fresh weights) or remove the overrides"
        )
    if m.tokenizer == "train" and pretrained:
        p.append(
            "model.tokenizer: 'train' makes a new vocabulary, which pretrained weights cannot use; "
            "set model.from_config=true or name the model's tokenizer"
        )
    if (
        m.tokenizer not in (None, "train")
        and _looks_local(m.tokenizer)
        and not os.path.isdir(os.path.expanduser(m.tokenizer))
    ):
        p.append(f"model.tokenizer: directory {m.tokenizer!r} does not exist")
    from_bundle = m.bundle is not None and m.from_config  # the bundle's config stands in for name_or_path's
    if (
        not from_bundle
        and m.name_or_path is not None
        and _looks_local(m.name_or_path)
        and not os.path.isdir(os.path.expanduser(m.name_or_path))
    ):
        p.append(
            f"model.name_or_path: directory {m.name_or_path!r} does not exist; give a model directory or a hub id like org/name"
        )
    if m.bundle is not None and m.tokenizer is not None:
        p.append("model.bundle: set together with model.tokenizer; the bundle holds the tokenizer, remove one")
    every = m.gradient_checkpointing_every
    if every < 1:
        p.append(f"model.gradient_checkpointing_every: must be 1 or more (every Nth decoder layer), got {every}")
    elif every > 1 and not m.gradient_checkpointing:
        p.append(
            f"model.gradient_checkpointing_every: {every} chooses the layers gradient checkpointing recomputes; "
            "set model.gradient_checkpointing=true, or leave it at 1"
        )
    if m.lora.enabled and not m.lora.target_modules:
        p.append("model.lora.target_modules: empty; name the modules to adapt, e.g. [q_proj, v_proj] or [all-linear]")
    if m.dtype == "fp16" and cfg.training.bf16:
        p.append(
            "model.dtype: fp16 weights with training.bf16 mixed precision do not mix; to train in bf16 and save the "
            "model in fp16, set model.dtype=fp32 (or bf16) and output.dtype=fp16"
        )


def _looks_local(ref: str) -> bool:
    """A hub id is 'name' or 'org/name'; anything with more parts, a leading dot, ~ or / is a path."""
    return ref.startswith((".", "/", "~")) or ref.count("/") > 1 or os.path.exists(ref)


def _check_data(cfg: RunConfig, p: list[str]) -> None:
    d = cfg.data
    if d.train_files and d.dataset_name:
        p.append("data.train_files: set together with data.dataset_name; use one source of training data")
    if d.dataset_config and not d.dataset_name:
        p.append("data.dataset_config: set without data.dataset_name")
    for key in ("train_files", "validation_files"):
        patterns = getattr(d, key)
        formats = set()
        for pattern in patterns:
            expanded = os.path.expanduser(pattern)
            if glob.has_magic(expanded):
                if not expand_files([pattern]):
                    p.append(f"data.{key}: glob {pattern!r} matches no file")
                    continue
                files = expand_files([pattern])
            elif not os.path.exists(expanded):
                p.append(f"data.{key}: file {pattern!r} does not exist")
                continue
            elif os.path.isdir(expanded):
                p.append(
                    f"data.{key}: {pattern!r} is a directory; give files or a glob like {pattern.rstrip('/')}/*.jsonl"
                )
                continue
            elif not os.path.isfile(expanded):
                # A FIFO or device would be dropped when the paths are expanded, and the embedded corpus trained instead.
                p.append(
                    f"data.{key}: {pattern!r} is not a regular file (a FIFO, socket or device); copy the data into a file"
                )
                continue
            else:
                files = [expanded]
            for f in files:
                fmt = file_format(f)
                if fmt is None:
                    known = ", ".join(sorted(FORMATS))
                    p.append(f"data.{key}: cannot read {f!r}: unknown extension (known: {known})")
                formats.add(fmt)
        formats.discard(None)
        if len(formats) > 1:
            p.append(f"data.{key}: mixes formats {sorted(formats)}; use files of one format")
    if d.validation_split != "auto" and not d.dataset_name:
        p.append(
            f"data.validation_split: {d.validation_split!r} names a split of data.dataset_name, which is not set; "
            "with files, give data.validation_files (or leave validation_split at auto)"
        )
    elif d.validation_split == "train":
        p.append("data.validation_split: 'train' is the training split; name another split (e.g. test), or auto")
    if d.validation_files and not (d.train_files or d.dataset_name):
        p.append("data.validation_files: set without data.train_files or data.dataset_name; give the training data too")
    if not d.validation_files and not 0 < d.validation_split_percentage < 100:
        p.append(
            f"data.validation_split_percentage: must be between 1 and 99 when no validation files are given, got {d.validation_split_percentage}"
        )
    if d.template is not None:
        _check_template(d.template, p)
    for key, template in (("prompt_template", d.prompt_template), ("completion_template", d.completion_template)):
        if template is None:
            continue
        if d.format != "prompt_completion":
            p.append(
                f"data.{key}: writes one part of a prompt/answer row, but data.format is {d.format}; set "
                f"data.format=prompt_completion or remove data.{key}"
            )
        else:  # a fixed instruction ("Write a document: ") is a prompt without a placeholder
            _check_template(template, p, f"data.{key}", needs_placeholder=key == "completion_template")
    _check_format(d, p)
    if d.store is not None:
        _check_store(d, p)
    if d.document_mask and not d.packing:
        p.append(
            "data.document_mask: needs data.packing=true (padding already keeps documents apart); remove it or set data.packing=true"
        )
    if d.streaming and d.store is None and cfg.training.max_steps < 0:
        p.append("data.streaming: a stream has no length; set training.max_steps to a positive number of steps")
    if d.streaming and d.store is None and not d.packing and d.max_length is None:
        p.append(
            "data.max_length: padding (data.packing=false) with streaming needs a fixed max_length; set data.max_length, e.g. 512"
        )


# data.loss_on values each data.format can mark: a plain document has no answer, a prompt/completion
# row no assistant turn, a conversation no single completion.
_LOSS_ON = {"text": ("all",), "prompt_completion": ("all", "completion"), "chat": ("all", "assistant")}


def _check_format(d: DataConfig, p: list[str]) -> None:
    """data.format with the keys that go with it: what data.loss_on can mean, the chat template file,
    and the paths that do not carry a loss mask yet (a token store, a stream)."""
    if d.loss_on is not None and d.loss_on not in _LOSS_ON[d.format]:
        fits = next(f for f, allowed in _LOSS_ON.items() if d.loss_on in allowed and f != "text")
        p.append(
            f"data.loss_on: {d.loss_on} needs data.format={fits}, but data.format is {d.format}; "
            f"use data.loss_on={' or '.join(_LOSS_ON[d.format])}, or set data.format={fits}"
        )
    if d.chat_template is not None:
        if d.format != "chat":
            p.append(
                f"data.chat_template: set with data.format={d.format}; it renders conversations, set data.format=chat or remove it"
            )
        elif not os.path.isfile(os.path.expanduser(d.chat_template)):
            p.append(
                f"data.chat_template: {d.chat_template!r} is not a file; give a Jinja chat-template file, or leave it empty for the tokenizer's own"
            )
    if d.format == "text":
        return
    if d.format == "prompt_completion" and not (d.train_files or d.dataset_name or d.store or d.completion_template):
        p.append(
            "data.format: prompt_completion needs data with prompt and completion columns (the embedded data has "
            "stories and conversations); give data.train_files, or data.completion_template={text} to answer with "
            "the stories, or use data.format=chat for the embedded conversations"
        )
    if d.template is not None:
        p.append(
            f"data.template: renders plain documents, but data.format is {d.format}; remove data.template "
            "(a conversation is rendered by its chat template, a prompt/completion row by its two columns)"
        )


def _check_store(d: DataConfig, p: list[str]) -> None:
    """Cheap checks of data.store; its files and the match with the tokenizer are checked when it is opened."""
    path = os.path.expanduser(d.store or "")
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        p.append(
            f"data.store: {d.store!r} is not a token store (no manifest.json); make one with supertune prepare CONFIG --out DIR"
        )
    if d.dataset_name:
        p.append("data.store: set together with data.dataset_name; the store already holds the data, remove one")


def _check_template(template: str, p: list[str], key: str = "data.template", needs_placeholder: bool = True) -> None:
    try:
        parts = [
            (f, spec, conversion) for _, f, spec, conversion in string.Formatter().parse(template) if f is not None
        ]
    except ValueError as exc:
        p.append(f"{key}: {exc}; write placeholders as {{text}} and literal braces as {{{{ }}}}")
        return
    fields = [f for f, _, _ in parts]
    if not fields and needs_placeholder:
        p.append(f"{key}: has no placeholder; include {{text}} (or another {{column}}) where the document goes")
    elif any(not f.isidentifier() for f in fields):
        p.append(f"{key}: placeholders must be column names like {{text}}, got {fields}")
    elif any(spec or conversion for _, spec, conversion in parts):
        # A format spec ({text:>{width}}) or conversion ({text!r}) would fail, or quote every document, at run time.
        shown = next("{" + f + (f"!{c}" if c else "") + (f":{s}" if s else "") + "}" for f, s, c in parts if s or c)
        p.append(
            f"{key}: {shown} has a format spec or conversion; placeholders are plain {{column}}, literal braces {{{{ }}}}"
        )


def _check_training(cfg: RunConfig, p: list[str]) -> None:
    t = cfg.training
    p += objective_config_problems(cfg)
    if t.bf16 and t.fp16:
        p.append("training.bf16: set together with training.fp16; choose one mixed precision")
    if t.init_optimizer_from is not None:
        start = os.path.expanduser(t.init_optimizer_from)
        if not os.path.isfile(os.path.join(start, "optimizer.pt")):
            p.append(
                f"training.init_optimizer_from: {t.init_optimizer_from!r} is not a checkpoint with an optimizer.pt; give a checkpoint-N directory of a ddp run"
            )
        if cfg.distributed.strategy != "ddp":
            p.append(
                f"training.init_optimizer_from: needs distributed.strategy=ddp ({cfg.distributed.strategy} keeps its optimizer state in its own format)"
            )
    for name in t.speed_skip:
        if name not in SPEED_PIECES:
            p.append(f"training.speed_skip: {name!r} is not a speed-up; name any of {', '.join(SPEED_PIECES)}")
    if t.float8 and cfg.distributed.strategy != "ddp":
        # ZeRO shards and gathers the weights in its own hooks and FSDP would need torchao's float8
        # all-gather set up with it; neither is tested with float8 here.
        p.append(
            f"training.float8: needs distributed.strategy=ddp, got {cfg.distributed.strategy}; remove training.float8"
        )
    if t.float8 and cfg.model.lora.enabled:
        # peft wraps the very linear layers float8 would swap, and adds adapters beside them: untested.
        p.append("training.float8: not with model.lora.enabled (float8 under LoRA adapters is untested); remove one")
    for sink in t.report_to:
        if sink not in REPORT_SINKS:
            p.append(
                f"training.report_to: {sink!r} is not supported; use any of {', '.join(REPORT_SINKS[:-1])}, or [] (metrics.jsonl is always written)"
            )
    if t.mlflow_tracking_uri and "mlflow" not in t.report_to:
        p.append(
            "training.mlflow_tracking_uri: set, but training.report_to has no mlflow; add mlflow to training.report_to or leave the URI empty"
        )


def _check_launch(cfg: RunConfig, p: list[str]) -> None:
    la, dist = cfg.launch, cfg.distributed
    _positive(p, "launch.nodes", la.nodes)
    _positive(p, "launch.procs_per_node", la.procs_per_node)
    if la.gpus_per_node is not None and la.gpus_per_node < 0:
        p.append(f"launch.gpus_per_node: must not be negative, got {la.gpus_per_node}")
    if la.master_port is not None and not 1024 <= la.master_port <= 65535:
        p.append(f"launch.master_port: must be a port between 1024 and 65535, got {la.master_port}")
    if la.max_restarts < 0:
        p.append(f"launch.max_restarts: must not be negative, got {la.max_restarts}")
    if dist.offload != "none" and not dist.strategy.startswith("zero"):
        p.append(
            f"distributed.offload: {dist.offload} offload is a DeepSpeed ZeRO feature; set distributed.strategy to zero2 or zero3"
        )
    if dist.offload == "nvme" and not dist.nvme_path:
        p.append("distributed.nvme_path: offload nvme needs a fast local directory, e.g. distributed.nvme_path=/tmp")
    if dist.offload == "nvme" and dist.strategy != "zero3":
        p.append("distributed.offload: nvme offload needs distributed.strategy zero3")
    if dist.strategy != "fsdp" and dist.fsdp != FsdpConfig():
        p.append(
            f"distributed.fsdp: set while distributed.strategy is {dist.strategy}; set distributed.strategy=fsdp or remove it"
        )
    _check_deepspeed(cfg, p)


def _check_deepspeed(cfg: RunConfig, p: list[str]) -> None:
    """Your own DeepSpeed config: a readable file for a zero strategy (its contents are checked against
    the run, and by DeepSpeed, with the strategy in supertune.distributed.checks)."""
    dist = cfg.distributed
    path = dist.deepspeed_config
    for key, given in (("deepspeed_config", path), ("deepspeed", dist.deepspeed)):
        if given and not dist.strategy.startswith("zero"):
            p.append(
                f"distributed.{key}: set while distributed.strategy is {dist.strategy}; DeepSpeed runs with "
                "distributed.strategy=zero1, zero2 or zero3 (the ZeRO stage of your file)"
            )
    if path is None:
        return
    if not path.endswith((".json", ".yaml", ".yml")):
        p.append(
            f"distributed.deepspeed_config: {path!r} is neither .json nor .yaml/.yml; give a DeepSpeed JSON (or YAML) file"
        )
    elif not os.path.isfile(os.path.expanduser(path)):
        p.append(f"distributed.deepspeed_config: file {path!r} does not exist")


def _check_slurm(cfg: RunConfig, p: list[str]) -> None:
    """Every slurm.* value, with the rules the job script renderer relies on (config.job_values)."""
    slurm = cfg.slurm
    if slurm.max_restarts < 0:
        p.append(f"slurm.max_restarts: must not be negative, got {slurm.max_restarts} (0: never requeue)")
    problem = time_problem(slurm.time)
    if problem:
        p.append(f"slurm.time: {problem}")
    elif not 10 <= slurm.signal_lead < time_seconds(slurm.time):
        p.append(
            f"slurm.signal_lead: {slurm.signal_lead} s must be at least 10 and less than slurm.time ({slurm.time}); "
            "allow one training step plus one checkpoint save, e.g. 300"
        )
    for key in ("partition", "account", "qos"):
        value = getattr(slurm, key)
        problem = value and slurm_name_problem(value)
        if problem:
            p.append(f"slurm.{key}: {problem}")
    problem = slurm.mem and memory_problem(slurm.mem)
    if problem:
        p.append(f"slurm.mem: {problem}")
    for arg in slurm.extra_args:
        problem = sbatch_option_problem(arg)
        if problem:
            p.append(f"slurm.extra_args: {problem}")
    if slurm.preflight_gbps is not None and not (slurm.preflight_gbps > 0 and math.isfinite(slurm.preflight_gbps)):
        p.append(f"slurm.preflight_gbps: must be a positive number of GB/s, got {slurm.preflight_gbps}")
    if slurm.preflight_gbps is not None and not slurm.preflight:
        p.append("slurm.preflight_gbps: set without slurm.preflight; add slurm.preflight=true (or submit --preflight)")
    problem = byte_size_problem(slurm.preflight_max_size)
    if problem:
        p.append(f"slurm.preflight_max_size: {problem}")
    elif parse_byte_size(slurm.preflight_max_size) < 2**20:
        p.append(
            f"slurm.preflight_max_size: {slurm.preflight_max_size!r} is below the smallest message (1M); e.g. 1M or 256M"
        )
