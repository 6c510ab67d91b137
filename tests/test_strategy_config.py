"""distributed.strategy without training: the DeepSpeed JSON, the checks before launch, the FSDP settings, the guard."""

from __future__ import annotations

import pytest
import torch

from supertune.cli.main import main
from supertune.config.schema import RunConfig
from supertune.distributed import checks
from supertune.distributed.deepspeed_json import deepspeed_config, resolved_for_check
from supertune.errors import UserError


def _cfg(strategy: str, offload: str = "none", **training) -> RunConfig:
    cfg = RunConfig()
    cfg.distributed.strategy = strategy
    cfg.distributed.offload = offload
    if offload == "nvme":
        cfg.distributed.nvme_path = "/tmp"
    for key, value in training.items():
        setattr(cfg.training, key, value)
    return cfg


# --- the JSON: which keys for which stage and offload ---------------------------------------------

AUTO_FROM_TRAINER = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping")


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_training_values_are_left_to_the_trainer(strategy):
    ds = deepspeed_config(_cfg(strategy))
    for key in AUTO_FROM_TRAINER:
        assert ds[key] == "auto"
    assert ds["bf16"] == {"enabled": "auto"} and ds["fp16"] == {"enabled": "auto"}
    # derived by DeepSpeed from micro batch x accumulation x processes: right for any process count
    assert "train_batch_size" not in ds
    assert ds["zero_optimization"]["stage"] == int(strategy[-1])
    assert "optimizer" not in ds  # the Trainer's own optimizer (training.optim) runs


def test_zero1_is_the_stage_alone():
    assert deepspeed_config(_cfg("zero1"))["zero_optimization"] == {"stage": 1}


def test_zero2_buckets_gradients_and_keeps_parameters_whole():
    zero = deepspeed_config(_cfg("zero2"))["zero_optimization"]
    assert zero == {"stage": 2, "contiguous_gradients": True, "overlap_comm": True, "reduce_bucket_size": "auto"}


def test_zero3_gathers_a_16bit_model_on_save():
    zero = deepspeed_config(_cfg("zero3"))["zero_optimization"]
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["stage3_prefetch_bucket_size"] == "auto" and zero["stage3_param_persistence_threshold"] == "auto"
    assert "offload_optimizer" not in zero and "offload_param" not in zero


def test_cpu_offload_moves_the_optimizer_and_with_zero3_the_parameters():
    z2 = deepspeed_config(_cfg("zero2", "cpu"))
    assert z2["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in z2["zero_optimization"]  # parameters are never partitioned below stage 3
    assert z2["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    }
    z3 = deepspeed_config(_cfg("zero3", "cpu"))["zero_optimization"]
    assert z3["offload_param"] == {"device": "cpu", "pin_memory": True}


def test_nvme_offload_names_the_directory():
    zero = deepspeed_config(_cfg("zero3", "nvme"))["zero_optimization"]
    for key in ("offload_optimizer", "offload_param"):
        assert zero[key] == {"device": "nvme", "pin_memory": True, "nvme_path": "/tmp"}


def test_resolving_auto_uses_the_training_section():
    cfg = _cfg(
        "zero3",
        "cpu",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=5,
        max_grad_norm=0.5,
        learning_rate=1e-4,
        adam_beta2=0.99,
        bf16=True,
    )
    ds = resolved_for_check(deepspeed_config(cfg), cfg)
    assert "auto" not in repr(ds)
    assert ds["train_micro_batch_size_per_gpu"] == 3 and ds["gradient_accumulation_steps"] == 5
    assert ds["gradient_clipping"] == 0.5 and ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    assert ds["optimizer"]["params"]["lr"] == 1e-4 and ds["optimizer"]["params"]["betas"] == [0.9, 0.99]


# --- checks before launch, with DeepSpeed's own classes ---------------------------------------------


@pytest.mark.parametrize(
    "strategy,offload",
    [("zero1", "none"), ("zero2", "none"), ("zero3", "none"), ("zero1", "cpu"), ("zero2", "cpu"), ("zero3", "cpu")],
)
def test_deepspeed_accepts_every_generated_config(strategy, offload):
    assert checks.strategy_problems(_cfg(strategy, offload)) == []


def test_what_deepspeed_rejects_becomes_one_line(monkeypatch):
    monkeypatch.setattr(checks, "deepspeed_config", lambda cfg: {"zero_optimization": {"stage": 9}})
    problems = checks.strategy_problems(_cfg("zero2"))
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].startswith("distributed.strategy: DeepSpeed rejects this zero2 setup: ")


def test_checks_leave_no_deepspeed_setting_behind():
    import os

    checks.strategy_problems(_cfg("zero2"))
    assert "DS_ACCELERATOR" not in os.environ  # it would reach a submitted GPU job


def _aio_buildable() -> bool:
    with checks._quiet_deepspeed():
        builder = checks._accelerator().create_op_builder("AsyncIOBuilder")
        return builder is not None and builder.is_compatible(verbose=False)


def _fp16_supported() -> bool:
    with checks._quiet_deepspeed():
        return bool(checks._accelerator().is_fp16_supported())


REFUSED = [
    (
        ["distributed.strategy=zero2", "distributed.offload=cpu", "training.optim=adafactor"],
        "training.optim: adafactor cannot run under distributed.offload=cpu",
    ),
    (
        [
            "distributed.strategy=zero3",
            "model.lora.enabled=true",
            "model.lora.merge_on_save=true",
            "model.name_or_path=gpt2",
        ],
        "model.lora.merge_on_save: not supported with distributed.strategy=zero3",
    ),
    (
        ["distributed.strategy=zero3", "model.lora.enabled=true"],
        "model.lora.enabled: adapters on fresh weights need the base model saved too",
    ),
    # already refused by the schema checks, listed here so that the whole family stays covered
    (
        ["distributed.strategy=ddp", "distributed.offload=cpu"],
        "distributed.offload: cpu offload is a DeepSpeed ZeRO feature",
    ),
    (
        ["distributed.strategy=zero3", "distributed.offload=nvme"],
        "distributed.nvme_path: offload nvme needs a fast local directory",
    ),
    (
        ["distributed.strategy=zero2", "distributed.offload=nvme", "distributed.nvme_path=/tmp"],
        "nvme offload needs distributed.strategy zero3",
    ),
]


@pytest.mark.parametrize(("args", "expected"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_combinations_give_one_clear_line(capsys, args, expected):
    code = main(["config", "show", *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU accelerator only")
def test_deepspeed_says_what_this_machine_cannot_do(capsys):
    if _aio_buildable():
        pytest.skip("DeepSpeed's async_io op builds here")
    code = main(
        ["config", "show", "distributed.strategy=zero3", "distributed.offload=nvme", "distributed.nvme_path=/tmp"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "distributed.offload: nvme needs DeepSpeed's async_io op" in err and "libaio" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU accelerator only")
def test_fp16_on_an_accelerator_without_it_is_refused(capsys):
    if _fp16_supported():
        pytest.skip("this CPU does fp16")
    code = main(["config", "show", "distributed.strategy=zero2", "training.fp16=true"])
    assert code == 2 and "training.fp16: DeepSpeed's cpu accelerator does not support fp16" in capsys.readouterr().err


def test_fsdp_with_checkpoints_passes_validation_and_the_trainer_saves_the_model_alone(capsys):
    """FSDP checkpoints are sharded (tests/test_fsdp_resume.py): nothing to refuse. The Trainer is told
    to save only the model, the one way it starts with checkpoints of a model sharded before it; the
    optimizer, scheduler and RNG files are written by supertune's Trainer."""
    from supertune.distributed.strategy import strategy_arguments
    from supertune.launch.environment import LaunchEnvironment

    assert main(["config", "show", "distributed.strategy=fsdp"]) == 0
    assert "save_strategy" not in capsys.readouterr().err
    assert strategy_arguments(_cfg("fsdp"), None, LaunchEnvironment(world_size=2)) == {"save_only_model": True}
    assert strategy_arguments(_cfg("ddp"), None, LaunchEnvironment(world_size=2)) == {}


# --- FSDP: what is refused before sharding, and the guard ------------------------------------------


def test_hybrid_with_one_process_per_node_is_refused():
    from supertune.distributed.fsdp import fsdp_mesh
    from supertune.launch.environment import LaunchEnvironment

    cfg = _cfg("fsdp")
    cfg.distributed.fsdp.sharding = "hybrid"
    with pytest.raises(UserError, match="distributed.fsdp.sharding: hybrid shards within a node"):
        fsdp_mesh(cfg, LaunchEnvironment(world_size=2, local_world_size=1, num_nodes=2))


def test_fsdp_in_one_process_shards_on_a_mesh_of_one():
    """One process (what a single GPU allows) takes the sharded path: DTensor parameters on a mesh of
    one, FSDP units, its own one-process group; nothing is split."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from transformers import LlamaConfig, LlamaForCausalLM

    from supertune.distributed.fsdp import mesh_shape, shard_model
    from supertune.distributed.guard import check_fsdp
    from supertune.launch.environment import LaunchEnvironment

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    try:
        shard_model(model, _cfg("fsdp"), LaunchEnvironment(world_size=1))
        assert isinstance(model, FSDPModule) and mesh_shape(model) == {"dp_shard": 1}
        assert check_fsdp(model, True, 1)["mesh"] == {"dp_shard": 1}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3", "ddp"])
def test_guard_stops_a_run_wrapped_otherwise(strategy):
    """What accelerate does on CPU when FSDP is asked: a plain (or DDP) module. The run must stop."""
    from supertune.distributed.guard import check_wrapped

    model = torch.nn.Linear(2, 2)
    with pytest.raises(
        UserError, match=f"distributed.strategy: {strategy} was asked but the model is wrapped as Linear"
    ):
        check_wrapped(strategy, model, model, accelerator_processes=2, world_size=2)


def test_guard_stops_a_run_that_lost_its_processes():
    from supertune.distributed.guard import check_wrapped

    model = torch.nn.Linear(2, 2)
    with pytest.raises(UserError, match="the Trainer sees 1 process\\(es\\) of 2"):
        check_wrapped("zero2", model, model, accelerator_processes=1, world_size=2)


def test_one_process_ddp_needs_no_wrapper():
    from supertune.distributed.guard import check_wrapped

    model = torch.nn.Linear(2, 2)
    assert check_wrapped("ddp", model, model, 1, 1)["held_fraction"] == 1.0


# --- your own DeepSpeed config (distributed.deepspeed_config) and single settings (distributed.deepspeed) ---


def _resolved(tmp_path, *overrides):
    from supertune.resolve import resolve_run_config

    return resolve_run_config(None, list(overrides))


def _json(tmp_path, data, name="ds.json"):
    import json

    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


TWCC_ZERO2 = {  # the shape of the TWCC recipe's ZeRO-2 file: "auto" where the Trainer knows the value
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "steps_per_print": 2000,
    "wall_clock_breakdown": False,
}


def test_your_file_is_the_base_and_only_what_must_agree_is_filled(tmp_path):
    path = _json(tmp_path, TWCC_ZERO2)
    cfg = _resolved(tmp_path, "distributed.strategy=zero2", f"distributed.deepspeed_config={path}")
    ds = deepspeed_config(cfg)
    # the file's own settings, as written
    assert ds["zero_optimization"]["allgather_bucket_size"] == 2e8 and ds["zero_optimization"]["reduce_scatter"] is True
    assert ds["fp16"]["initial_scale_power"] == 16 and ds["steps_per_print"] == 2000
    # what supertune fills: from the training section, through "auto"; train_batch_size left to DeepSpeed
    assert ds["bf16"] == {"enabled": "auto"} and ds["train_micro_batch_size_per_gpu"] == "auto"
    assert "train_batch_size" not in ds and "optimizer" not in ds
    assert checks.strategy_problems(cfg) == []


def test_a_conflicting_value_is_refused_naming_both(tmp_path, capsys):
    data = dict(TWCC_ZERO2, gradient_clipping=0.5, train_micro_batch_size_per_gpu=4, bf16={"enabled": True})
    data["zero_optimization"] = dict(data["zero_optimization"], offload_optimizer={"device": "cpu"})
    path = _json(tmp_path, data)
    code = main(["config", "show", "distributed.strategy=zero3", f"distributed.deepspeed_config={path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("supertune: error: 5 problems in the config:"), err
    where = f"distributed.deepspeed_config ({path})"
    for line in (
        f"{where}: gradient_clipping is 0.5, but training.max_grad_norm is 1.0; remove it there (supertune fills it from training.max_grad_norm) or set training.max_grad_norm=0.5",
        f"{where}: train_micro_batch_size_per_gpu is 4, but training.per_device_train_batch_size is 16;",
        f"{where}: bf16.enabled is True, but training.bf16 is false;",
        f"{where}: zero_optimization.stage is 2, but distributed.strategy is zero3; remove it there (supertune fills it from distributed.strategy) or set distributed.strategy=zero2",
        f"{where}: zero_optimization.offload_optimizer.device is 'cpu', but distributed.offload is none;",
    ):
        assert line in err, (line, err)


def test_train_batch_size_is_the_global_batch(tmp_path):
    from supertune.config.errors import ConfigError

    path = _json(tmp_path, {"train_batch_size": 16, "zero_optimization": {"stage": 2}})
    with pytest.raises(ConfigError, match=r"train_batch_size is 16; set training.global_batch_size=16 instead"):
        _resolved(tmp_path, "distributed.strategy=zero2", f"distributed.deepspeed_config={path}")
    cfg = _resolved(
        tmp_path,
        "distributed.strategy=zero2",
        f"distributed.deepspeed_config={path}",
        "training.global_batch_size=16",
        "training.per_device_train_batch_size=8",
    )
    assert "train_batch_size" not in deepspeed_config(cfg)  # DeepSpeed derives it for any process count
    with pytest.raises(ConfigError, match="train_batch_size is 16, but training.global_batch_size is 32"):
        _resolved(
            tmp_path,
            "distributed.strategy=zero2",
            f"distributed.deepspeed_config={path}",
            "training.global_batch_size=32",
        )


def test_single_settings_go_where_deepspeed_reads_them(tmp_path):
    cfg = _resolved(
        tmp_path,
        "distributed.strategy=zero2",
        "distributed.deepspeed.reduce_bucket_size=1e7",
        "distributed.deepspeed.overlap_comm=false",
        "distributed.deepspeed.zero_optimization.contiguous_gradients=false",
        "distributed.deepspeed.steps_per_print=10",
    )
    ds = deepspeed_config(cfg)
    zero = ds["zero_optimization"]
    assert zero["reduce_bucket_size"] == 10_000_000 and isinstance(zero["reduce_bucket_size"], int)
    assert zero["overlap_comm"] is False and zero["contiguous_gradients"] is False and ds["steps_per_print"] == 10
    # the rest is supertune's generated config
    assert zero["stage"] == 2 and ds["gradient_clipping"] == "auto"
    assert checks.strategy_problems(cfg) == []
    from supertune.config.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"distributed.deepspeed.gradient_clipping: gradient_clipping is 0.5, but training.max_grad_norm is 1.0",
    ):
        _resolved(tmp_path, "distributed.strategy=zero2", "distributed.deepspeed.gradient_clipping=0.5")


def test_a_yaml_file_with_offload_gets_the_cpu_optimizer_and_the_gathered_save(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text("zero_optimization:\n  stage: 3\n  reduce_bucket_size: 5e8\n  offload_param: {device: cpu}\n")
    cfg = _resolved(
        tmp_path, "distributed.strategy=zero3", "distributed.offload=cpu", f"distributed.deepspeed_config={path}"
    )
    ds = deepspeed_config(cfg)
    zero = ds["zero_optimization"]
    assert zero["reduce_bucket_size"] == 500_000_000  # YAML 1.1 reads 5e8 as text
    assert zero["offload_param"] == {"device": "cpu"} and zero["offload_optimizer"] == {
        "device": "cpu",
        "pin_memory": True,
    }
    assert ds["optimizer"]["type"] == "AdamW" and zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert checks.strategy_problems(cfg) == []
    path.write_text("zero_optimization: {stage: 3, stage3_gather_16bit_weights_on_model_save: false}\n")
    from supertune.config.errors import ConfigError

    with pytest.raises(
        ConfigError, match="the final model .output.save_model. is saved by gathering the ZeRO-3 weights"
    ):
        _resolved(tmp_path, "distributed.strategy=zero3", f"distributed.deepspeed_config={path}")


def test_deepspeed_still_checks_what_your_file_says(tmp_path, capsys):
    path = _json(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}})
    code = main(["config", "show", "distributed.strategy=zero2", f"distributed.deepspeed_config={path}"])
    err = capsys.readouterr().err
    assert (
        code == 2 and "distributed.strategy: DeepSpeed rejects this zero2 setup:" in err and "reduce_bucket_sise" in err
    )
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["distributed.deepspeed_config={dir}/none.json", "distributed.strategy=zero2"],
            "distributed.deepspeed_config: file '{dir}/none.json' does not exist",
        ),
        (
            ["distributed.deepspeed_config={dir}/ds.txt", "distributed.strategy=zero2"],
            "is neither .json nor .yaml/.yml",
        ),
        (
            ["distributed.deepspeed_config={dir}/ds.json"],
            "distributed.deepspeed_config: set while distributed.strategy is ddp",
        ),
        (["distributed.deepspeed.overlap_comm=false"], "distributed.deepspeed: set while distributed.strategy is ddp"),
        (["distributed.deepspeed_config={dir}/bad.json", "distributed.strategy=zero2"], "bad.json' is not valid JSON"),
    ],
)
def test_unusable_files_are_one_line(tmp_path, capsys, args, expected):
    _json(tmp_path, {"zero_optimization": {"stage": 2}})
    (tmp_path / "ds.txt").write_text("{}")
    (tmp_path / "bad.json").write_text("{stage: 2")
    code = main(["config", "show", *(a.format(dir=tmp_path) for a in args)])
    err = capsys.readouterr().err
    assert code == 2 and expected.format(dir=tmp_path) in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_zero_option_names_are_deepspeeds():
    with checks._quiet_deepspeed():
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from supertune.distributed.deepspeed_user import ZERO_KEYS

    fields = DeepSpeedZeroConfig.model_fields
    assert ZERO_KEYS >= set(fields) | {f.alias for f in fields.values() if f.alias}


def test_a_misspelt_zero_option_is_not_passed_on_silently(capsys):
    code = main(["config", "show", "distributed.strategy=zero2", "distributed.deepspeed.reduce_bucket_sise=5"])
    err = capsys.readouterr().err
    assert (
        code == 2
        and "distributed.deepspeed.reduce_bucket_sise: not a ZeRO option (did you mean reduce_bucket_size?)" in err
    )
