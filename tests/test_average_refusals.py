"""Everything `supertune average` refuses: one line naming the input or flag and the way out, exit
code 2, and nothing written (no output, no staging directory left beside it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from average_models import make_checkpoint, save_adapter, save_model
from supertune.cli.main import main


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return [make_checkpoint(save_model(root / f"m{i}", i), tokens=100 * (i + 1), samples=i + 1) for i in range(2)]


def refused(capsys, tmp_path, *argv, out=None) -> str:
    """Run the command, expect exit 2 with one error line and nothing written; the error line."""
    out = out or tmp_path / "avg"
    before = set(out.parent.iterdir()) if out.parent.exists() else set()
    assert main(["average", *map(str, argv), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("supertune: error: "), err
    assert not [line for line in err if line.startswith("  - ")], "expected a single problem"
    after = set(out.parent.iterdir()) if out.parent.exists() else set()
    assert after == before, f"left behind: {sorted(p.name for p in after - before)}"
    return err[-1]


def copy_model(src, dst, change=None, drop=None):
    """A copy of a saved model whose model.safetensors is changed by `change(name, array)`, or lacks `drop`."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "model.safetensors":
            tensors = load_file(f)
            if drop:
                del tensors[drop]
            if change:
                tensors = {k: change(k, v) for k, v in tensors.items()}
            save_file(tensors, dst / f.name, metadata={"format": "pt"})
        elif f.name != "supertune-checkpoint.json":
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_fewer_than_two_inputs(capsys, tmp_path, models):
    assert "at least two models" in refused(capsys, tmp_path, models[0])


def test_an_output_that_is_an_input_or_inside_one(capsys, tmp_path, models):
    assert "itself" in refused(capsys, tmp_path, *models, out=models[0])
    assert "lies inside MODEL" in refused(capsys, tmp_path, *models, out=models[1] / "avg")


def test_an_output_that_exists(capsys, tmp_path, models):
    (tmp_path / "avg").mkdir()
    (tmp_path / "avg" / "old.txt").write_text("x")
    assert "holds files supertune did not write (old.txt)" in refused(capsys, tmp_path, *models)


def test_a_different_architecture(capsys, tmp_path, models):
    other = make_checkpoint(save_model(tmp_path / "wide", 3, hidden_size=64, intermediate_size=128), 10, 1)
    line = refused(capsys, tmp_path / "o", models[0], other, out=tmp_path / "o" / "avg")
    assert (
        "input 2" in line and "config.json differs from input 1's in" in line and "hidden_size 64 (input 1: 32)" in line
    )


def test_different_tensor_names(capsys, tmp_path, models):
    other = copy_model(models[1], tmp_path / "fewer", drop="model.norm.weight")
    line = refused(capsys, tmp_path / "o", models[0], other, "--weights", "uniform", out=tmp_path / "o" / "avg")
    assert "input 2" in line and "lacks 1 tensor(s)" in line and "model.norm.weight" in line


def test_different_dtypes(capsys, tmp_path, models):
    other = save_model(tmp_path / "bf16", 5, dtype=torch.bfloat16)
    line = refused(capsys, tmp_path / "o", models[0], other, "--weights", "uniform", out=tmp_path / "o" / "avg")
    assert (
        "input 2" in line
        and "differ in dtype" in line
        and "is BF16 [96, 32] against F32 [96, 32]" in line
        and "convert" in line
    )


def test_different_tokenizers(capsys, tmp_path, models):
    other = save_model(tmp_path / "tok", 5, tokenizer=1)
    line = refused(capsys, tmp_path / "o", models[0], other, "--weights", "uniform", out=tmp_path / "o" / "avg")
    assert "different tokenizer" in line and "input 2" in line


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_in_an_input_names_the_tensor_and_the_input(capsys, tmp_path, models, bad):
    def spoil(name, value):
        if name == "model.layers.1.mlp.up_proj.weight":
            value = value.copy()
            value.flat[7] = bad
        return value

    other = copy_model(models[1], tmp_path / "spoiled", change=spoil)
    line = refused(capsys, tmp_path / "o", models[0], other, "--weights", "uniform", out=tmp_path / "o" / "avg")
    assert "input 2" in line and "model.layers.1.mlp.up_proj.weight" in line
    assert ("1 NaN" if math.isnan(bad) else "1 Inf") in line


@pytest.mark.parametrize(
    "weights, message",
    [
        ("1,-1", "must be finite and not negative"),
        ("0,0", "every weight is zero"),
        ("1,2,3", "3 numbers for 2 inputs"),
        ("many", "neither tokens"),
    ],
)
def test_bad_weights(capsys, tmp_path, models, weights, message):
    assert message in refused(capsys, tmp_path, *models, "--weights", weights)


def test_tokens_unknown_names_the_input_and_the_way_out(capsys, tmp_path, models):
    bare = save_model(tmp_path / "bare", 7)
    line = refused(capsys, tmp_path / "o", models[0], bare, out=tmp_path / "o" / "avg")
    assert "--weights tokens: input 2" in line and "--weights uniform" in line


def test_adapters_and_full_models_together(capsys, tmp_path, models):
    adapter = save_adapter(tmp_path / "lora", models[0], seed=1)
    line = refused(capsys, tmp_path / "o", models[0], adapter, "--weights", "uniform", out=tmp_path / "o" / "avg")
    assert "hold LoRA adapters and the others full models" in line


def test_a_damaged_checkpoint(capsys, tmp_path, models):
    damaged = copy_model(models[1], tmp_path / "damaged")
    (damaged / "supertune-checkpoint.json").write_text((models[1] / "supertune-checkpoint.json").read_text())
    data = bytearray((damaged / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF  # same size, different bytes: only the sha256 can tell
    (damaged / "model.safetensors").write_bytes(bytes(data))
    line = refused(capsys, tmp_path / "o", models[0], damaged, out=tmp_path / "o" / "avg")
    assert "does not match its checkpoint manifest" in line and "input 2" in line


def test_values_beyond_fp16(capsys, tmp_path, models):
    big = copy_model(models[1], tmp_path / "big", change=lambda n, v: v * 1e6 if n == "lm_head.weight" else v)
    line = refused(
        capsys, tmp_path / "o", models[0], big, "--weights", "uniform", "--dtype", "fp16", out=tmp_path / "o" / "avg"
    )
    assert "lm_head.weight" in line and "use --dtype bf16 or fp32" in line


def test_integer_tensors_that_differ(capsys, tmp_path, models):
    a = copy_model(models[0], tmp_path / "a", change=lambda n, v: v)
    b = copy_model(models[1], tmp_path / "b", change=lambda n, v: v)
    for path, value in ((a, 1), (b, 2)):
        tensors = load_file(path / "model.safetensors")
        tensors["model.step_counter"] = np.array([value], dtype=np.int64)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    assert "is not floating point and differs" in refused(
        capsys, tmp_path / "o", a, b, "--weights", "uniform", out=tmp_path / "o" / "avg"
    )


def test_flags_that_need_another_flag(capsys, tmp_path, models):
    assert "--merge-first and --base go together" in refused(capsys, tmp_path, *models, "--merge-first")
    assert "--server-momentum needs --global-model" in refused(capsys, tmp_path, *models, "--server-momentum", "0.9")
    assert "must be in [0, 1)" in refused(
        capsys, tmp_path, *models, "--global-model", models[0], "--server-momentum", "1.5"
    )
    assert "--max-shard-size" in refused(capsys, tmp_path, *models, "--max-shard-size", "lots")


def test_merge_first_with_full_models_or_a_foreign_base(capsys, tmp_path, models):
    adapters = [save_adapter(tmp_path / f"lora{i}", models[0], seed=i) for i in range(2)]
    assert "are full models, not LoRA adapters" in refused(
        capsys, tmp_path / "o", *models, "--merge-first", "--base", models[0], out=tmp_path / "o" / "avg"
    )
    wide = save_model(tmp_path / "wide", 3, hidden_size=64, intermediate_size=128)
    line = refused(
        capsys,
        tmp_path / "o",
        *adapters,
        "--weights",
        "uniform",
        "--merge-first",
        "--base",
        wide,
        out=tmp_path / "o" / "avg",
    )
    assert "do not fit base tensor" in line


def test_a_global_model_of_another_shape(capsys, tmp_path, models):
    wide = save_model(tmp_path / "wide", 3, hidden_size=64, intermediate_size=128)
    line = refused(capsys, tmp_path / "o", *models, "--global-model", wide, out=tmp_path / "o" / "avg")
    assert line.count("--global-model") == 1 and "give the global model these inputs started from" in line


def test_several_problems_are_listed_together(tmp_path, models, capsys):
    bare = save_model(tmp_path / "bare", 7)
    other = save_model(tmp_path / "tok", 5, tokenizer=1)
    assert main(["average", str(models[0]), str(bare), str(other), "--out", str(tmp_path / "avg")]) == 2
    err = capsys.readouterr().err
    assert "supertune: error: " in err and not (tmp_path / "avg").exists()
    assert "different tokenizer" in err


def test_nothing_is_written_when_the_output_would_not_fit(capsys, tmp_path, models, monkeypatch):
    import supertune.averaging.job as job

    monkeypatch.setattr(job, "free_bytes", lambda path: 1000)
    assert "GB are free there" in refused(capsys, tmp_path, *models)
    assert json.loads((models[0] / "supertune-checkpoint.json").read_text())["tokens_seen"] == 100
