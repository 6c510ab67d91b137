"""Bad input of every kind gives one clear error naming the field; never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from supertune.cli.main import main


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "hello world"}\n' * 20)
    (tmp_path / "notes.xyz").write_text("x")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "bad.yaml").write_text("training:\n  max_steps: [1\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "three.yaml").write_text("training:\n  max_steps: -5\n  learning_rate: fast\ndata:\n  blocksize: 8\n")
    return tmp_path


# (arguments to `supertune config show`, text the single error must contain)
CASES = [
    (["training.max_steps=abc"], "training.max_steps: expected an integer"),
    (["training.max_steps=1.5"], "training.max_steps: expected an integer"),
    (["training.learning_rate=fast"], "training.learning_rate: expected a number"),
    (["training.bf16=maybe"], "training.bf16: expected true or false"),
    (["training.max_stepz=3"], "did you mean training.max_steps?"),
    (["training.block_size=4"], "did you mean data.block_size?"),
    (["data.block_size=-1"], "data.block_size: must be positive"),
    (["data.block_size=0"], "data.block_size: must be positive"),
    (["data.max_length=0"], "data.max_length: must be positive"),
    (["training.per_device_train_batch_size=0"], "training.per_device_train_batch_size: must be positive"),
    (["training.gradient_accumulation_steps=-2"], "training.gradient_accumulation_steps: must be positive"),
    (["training.eval_steps=0"], "training.eval_steps: must be positive"),
    (["training.warmup_steps=-1"], "training.warmup_steps: must not be negative"),
    (["training.adam_beta1=1.5"], "training.adam_beta1: must be in [0, 1)"),
    (["training.max_steps=0"], "training.max_steps: must be a positive number of steps or -1"),
    (
        ["slurm.time=00:05:00", "slurm.signal_lead=600"],
        "slurm.signal_lead: 600 s must be at least 10 and less than slurm.time (00:05:00)",
    ),
    (["slurm.signal_lead=5"], "slurm.signal_lead: 5 s must be at least 10"),
    (["slurm.max_restarts=-1"], "slurm.max_restarts: must not be negative"),
    (["launch.max_restarts=-3"], "launch.max_restarts: must not be negative"),
    (["model.dtype=fp64"], "model.dtype: 'fp64' is not one of fp32, bf16, fp16"),
    (["training.lr_scheduler_type=cosin"], "did you mean cosine?"),
    (["data.train_files=/nonexistent/train.txt"], "data.train_files: file '/nonexistent/train.txt' does not exist"),
    (["data.train_files=/nonexistent/*.jsonl"], "data.train_files: glob '/nonexistent/*.jsonl' matches no file"),
    (["data.train_files={dir}"], "is a directory"),
    (["data.train_files={dir}/notes.xyz"], "unknown extension"),
    (["data.train_files={a: b}"], "data.train_files: expected a list of a string"),
    (["data.train_files={dir}/train.jsonl", "data.dataset_name=wikitext"], "use one source of training data"),
    (["data.dataset_config=wikitext-2-raw-v1"], "data.dataset_config: set without data.dataset_name"),
    (["data.validation_files={dir}/train.jsonl"], "data.validation_files: set without data.train_files"),
    (["data.streaming=true", "training.max_steps=-1"], "data.streaming: a stream has no length"),
    (["data.streaming=true", "data.packing=false"], "data.max_length: padding (data.packing=false) with streaming"),
    (["data.validation_split_percentage=100"], "data.validation_split_percentage: must be between 1 and 99"),
    (["data.template=no placeholder here"], "data.template: has no placeholder"),
    (["data.template={unclosed"], "data.template:"),
    (["training.bf16=true", "training.fp16=true"], "choose one mixed precision"),
    (
        ["training.report_to=[comet]"],
        "training.report_to: 'comet' is not supported; use any of tensorboard, wandb, mlflow",
    ),
    (
        ["training.mlflow_tracking_uri=http://localhost:5000"],
        "training.mlflow_tracking_uri: set, but training.report_to has no mlflow",
    ),
    (["model.config_overrides=num_hidden_layers"], "model.config_overrides: 'num_hidden_layers' is not key=value"),
    (
        ["model.name_or_path={dir}/model", "model.config_overrides=num_hidden_layers=2"],
        "model.config_overrides: only applies",
    ),
    (["model.name_or_path={dir}/model", "model.tokenizer=train"], "model.tokenizer: 'train' makes a new vocabulary"),
    (["model.name_or_path=./does/not/exist"], "model.name_or_path: directory './does/not/exist' does not exist"),
    (["model.tokenizer=/no/such/tokenizer"], "model.tokenizer: directory '/no/such/tokenizer' does not exist"),
    (["model.lora.r=0"], "model.lora.r: must be positive"),
    (["model.lora.dropout=1.5"], "model.lora.dropout: must be in [0, 1)"),
    (["model.lora.enabled=true", "model.lora.target_modules=[]"], "model.lora.target_modules: empty"),
    (["model.tokenizer_vocab_size=100"], "model.tokenizer_vocab_size: a byte-level tokenizer needs"),
    (["output.name=a/b"], "output.name: 'a/b' cannot name a directory"),
    (["launch.nproc=0"], "launch.nproc: must be positive"),
    (["generate.temperature=0"], "generate.temperature: must be positive"),
    (["evaluation.every_steps=10"], "evaluation.every_steps: there are no evaluation.tasks to run"),
    (
        ["evaluation.tasks=[supertune_corpus]", "evaluation.every_steps=10", "distributed.strategy=fsdp"],
        "evaluation.every_steps: distributed.strategy=fsdp shards the parameters",
    ),
    (["evaluation.tasks=['a,b']"], "evaluation.tasks: ['a,b'] holds an empty name or a comma"),
    (
        ["training.float8=true", "distributed.strategy=fsdp"],
        "training.float8: needs distributed.strategy=ddp, got fsdp",
    ),
    (["foo.bar=1"], "foo: unknown key"),
    (["model=3"], "model: expected a mapping"),
    (["training.max_steps"], "override 'training.max_steps': expected section.key=value"),
    (["=5"], "the key is empty"),
    (["training..max_steps=5"], "the key is empty or has an empty part"),
    (["training.max_steps=5", "training.max_steps.x=1"], "was already set to a value"),
    (["{dir}/missing.yaml"], "config file '{dir}/missing.yaml' does not exist"),
    (["{dir}/bad.yaml"], "is not valid YAML at line"),
    (["{dir}/list.yaml"], "the top level must be a mapping"),
]


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_gives_one_clear_error(files, capsys, args, expected):
    argv = ["config", "show"] + [a.replace("{dir}", str(files)) for a in args]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("supertune: error: ")
    assert expected.replace("{dir}", str(files)) in err
    assert len(err.strip().splitlines()) == 1, err


def test_at_least_thirty_distinct_cases():
    assert len({tuple(a) for a, _ in CASES}) >= 30


def test_every_problem_is_reported_at_once(files, capsys):
    code = main(["config", "show", str(files / "three.yaml")])
    err = capsys.readouterr().err
    assert code == 2
    assert "data.blocksize: unknown key (did you mean data.block_size?)" in err
    assert "training.learning_rate: expected a number" in err


def test_validation_problems_are_reported_together(capsys):
    code = main(["config", "show", "data.block_size=0", "launch.nproc=0", "training.logging_steps=-1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("supertune: error: 3 problems in the config:")
    for field in ("data.block_size", "launch.nproc", "training.logging_steps"):
        assert f"  - {field}:" in err


def test_real_console_script_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "training.max_steps=abc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "training.max_steps: expected an integer, got 'abc'" in proc.stderr


def test_good_overrides_resolve(capsys):
    assert (
        main(
            [
                "config",
                "show",
                "training.max_steps=7",
                "training.learning_rate=3e-4",
                "model.config_overrides=num_hidden_layers=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "max_steps: 7" in out
    assert "learning_rate: 0.0003" in out
    assert "num_hidden_layers: 2" in out
