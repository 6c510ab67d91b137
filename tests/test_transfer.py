"""Sending less (docs/federated/transfers.md, "Sending less"): a site's model or change encoded into a transfer
package (its own dtype, bf16, fp16, blockwise int8), read back a slice at a time and averaged onto the
round's global model; error feedback sends in later rounds what int8 rounded away; a damaged package,
or one taken from another model, is refused. A federation whose sites send int8 changes:
tests/test_federation_agents.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file, save_file

from supertune.averaging import average_checkpoints
from supertune.config.errors import ConfigError
from supertune.errors import UserError
from supertune.federation.config.load import load_federation
from supertune.transfer import Codec, PackageWeights, read_package, write_package
from supertune.transfer import package as package_module
from supertune.weight_files.tensor_files import TensorFile, WeightFiles
from transfer_decoding import decoded_change

SHAPES = {"w": (37, 29), "b": (29,)}


def _model(directory: Path, seed: int, scale: float = 1.0, like: dict | None = None) -> dict[str, np.ndarray]:
    """A model directory of float32 tensors (and an int64 counter): random, or `like` plus a random change."""
    rng = np.random.default_rng(seed)
    tensors = {n: rng.standard_normal(s).astype(np.float32) * scale for n, s in SHAPES.items()}
    tensors["w"][3, 4] = 40.0 * scale  # one outlier: only its block's precision may suffer
    if like is not None:
        tensors = {n: like[n] + tensors[n] for n in SHAPES}
    tensors["steps"] = np.arange(3, dtype=np.int64)
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def _weights(directory: Path) -> WeightFiles:
    return WeightFiles(directory, "model.safetensors")


@pytest.mark.parametrize(("codec", "levels", "value_bytes"), [("int8", 127, 1.0), ("int4", 7, 0.5)])
def test_blockwise_changes_come_back_within_half_a_blocks_scale_and_any_slice_decodes_alone(
    tmp_path, monkeypatch, codec, levels, value_bytes
):
    monkeypatch.setattr(package_module, "SLICE", 64)  # several slices per tensor, as a large model has
    base = _model(tmp_path / "base", 1)
    site = _model(tmp_path / "site", 2, scale=0.01, like=base)
    package = write_package(
        tmp_path / "sent", _weights(tmp_path / "site"), Codec(codec, 16), base=_weights(tmp_path / "base")
    )
    assert package.delta and package.codec == Codec(codec, 16) and package.residual is not None
    blocks = sum(-(-int(np.prod(s)) // 16) for s in SHAPES.values())
    payload = blocks * (16 * value_bytes + 4) + 3 * 8  # values, a float32 scale per block, the int64 counter
    assert 0 < package.sent_weight_bytes - payload < 512
    decoded = decoded_change(tmp_path / "sent", 16)
    for name in SHAPES:
        change = (site[name] - base[name]).reshape(-1)
        rows = np.pad(change, (0, -change.size % 16)).reshape(-1, 16)
        half_scale = np.repeat(np.abs(rows).max(axis=1) / levels / 2, 16)[: change.size]
        assert (np.abs(decoded[name].reshape(-1) - change) <= half_scale * 1.0001 + 1e-9).all(), name
    assert np.array_equal(decoded["steps"], np.arange(3))
    # the outlier's block alone is coarse
    w_error = np.abs(decoded["w"] - (site["w"] - base["w"]))
    assert w_error.max() > 10 * np.median(w_error)
    # The reader decodes any slice from the blocks that hold it, onto the base.
    read = PackageWeights(read_package(tmp_path / "sent"), _weights(tmp_path / "base"), "site")
    full = (base["w"] + decoded["w"]).reshape(-1)
    for start, stop in [(0, 1073), (5, 6), (15, 17), (100, 1000), (1070, 1073)]:
        assert np.allclose(read.rows("w", start, stop), full[start:stop], rtol=0, atol=1e-6), (start, stop)
    assert np.array_equal(read.rows("steps", 0, 3), np.arange(3))


def test_error_feedback_sends_in_later_rounds_what_int8_rounded_away(tmp_path):
    """Three rounds: each package's decoded change plus its residual is the true change plus the last
    residual, so the changes sent add up to the true changes less only the last residual."""
    codec = Codec("int8", 8)
    globals_ = [_model(tmp_path / "g0", 10)]
    sent_sum = {n: np.zeros(s, np.float64) for n, s in SHAPES.items()}
    true_sum = {n: np.zeros(s, np.float64) for n, s in SHAPES.items()}
    residual = None
    previous_residual = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    for r in (1, 2, 3):
        site = _model(tmp_path / f"x{r}", 20 + r, scale=0.003, like=globals_[-1])
        out = tmp_path / f"sent{r}"
        write_package(
            out, _weights(tmp_path / f"x{r}"), codec, base=_weights(tmp_path / f"g{r - 1}"), residual=residual
        )
        kept = load_file(str(out / "residual.safetensors"))
        decoded = decoded_change(out, 8)
        for n in SHAPES:
            change = site[n].astype(np.float64) - globals_[-1][n]
            assert np.allclose(decoded[n] + kept[n], change + previous_residual[n], atol=1e-6), (r, n)
            sent_sum[n] += decoded[n]
            true_sum[n] += change
        previous_residual = kept
        residual = TensorFile(out / "residual.safetensors")
        globals_.append(_model(tmp_path / f"g{r}", 30 + r, scale=0.003, like=globals_[-1]))
    for n in SHAPES:
        assert np.allclose(sent_sum[n] + previous_residual[n], true_sum[n], atol=1e-5)
        # without feedback the loss would be the sum of three roundings; with it, one residual
        assert np.abs(previous_residual[n]).max() <= np.abs(true_sum[n]).max() / 100


# (rtol, atol) of the model read back: fp32 changes add back within float32 rounding, a bf16 model keeps
# 8 bits of mantissa, an fp16 change 11 bits of the change (at most 0.4 here: the outlier)
@pytest.mark.parametrize(("codec", "delta", "tolerance", "bytes_per_value"), [
    ("same", False, (0, 0), 4), ("same", True, (0, 1e-6), 4), ("bf16", False, (2**-8, 0), 2),
    ("fp16", True, (0, 0.4 * 2**-11 + 1e-6), 2)])  # fmt: skip
def test_sixteen_and_thirty_two_bit_packages(tmp_path, codec, delta, tolerance, bytes_per_value):
    base = _model(tmp_path / "base", 1)
    site = _model(tmp_path / "site", 2, scale=0.01, like=base)
    package = write_package(
        tmp_path / "sent",
        _weights(tmp_path / "site"),
        Codec(codec),
        base=_weights(tmp_path / "base") if delta else None,
    )
    values = sum(int(np.prod(s)) for s in SHAPES.values())
    header = package.sent_weight_bytes - values * bytes_per_value - 3 * 8
    assert 0 < header < 512, package.sent_weight_bytes
    assert (package.residual is not None) == (delta and codec != "same")
    read = PackageWeights(package, _weights(tmp_path / "base") if delta else None, "site")
    for name in SHAPES:
        got = read.rows(name, 0, site[name].size).reshape(site[name].shape)
        assert read.entry(name).dtype == "F32"
        assert np.allclose(got, site[name], rtol=tolerance[0], atol=tolerance[1]), name


def test_averaged_packages_are_the_base_plus_the_weighted_decoded_changes(tmp_path):
    base = _model(tmp_path / "base", 1)
    for name, seed in (("a", 2), ("b", 3)):
        _model(tmp_path / name, seed, scale=0.01, like=base)
        write_package(
            tmp_path / f"sent-{name}", _weights(tmp_path / name), Codec("int8", 32), base=_weights(tmp_path / "base")
        )
    average_checkpoints(
        [tmp_path / "sent-a", tmp_path / "sent-b"], tmp_path / "avg", weights=[1.0, 3.0], delta_base=tmp_path / "base"
    )
    averaged = {}
    for f in (tmp_path / "avg").glob("*.safetensors"):
        averaged.update(load_file(str(f)))
    da, db = decoded_change(tmp_path / "sent-a", 32), decoded_change(tmp_path / "sent-b", 32)
    for n in SHAPES:
        expected = base[n] + 0.25 * da[n] + 0.75 * db[n]
        assert np.allclose(averaged[n], expected, atol=1e-6), n
    assert np.array_equal(averaged["steps"], np.arange(3))


def test_a_damaged_package_or_one_from_another_model_is_refused_and_nothing_is_written(tmp_path):
    base = _model(tmp_path / "base", 1)
    _model(tmp_path / "other", 9)
    for name, seed in (("a", 2), ("b", 3)):
        _model(tmp_path / name, seed, scale=0.01, like=base)
        write_package(
            tmp_path / f"sent-{name}", _weights(tmp_path / name), Codec("int8", 32), base=_weights(tmp_path / "base")
        )
    sent = [tmp_path / "sent-a", tmp_path / "sent-b"]

    def refused(*, delta_base) -> str:
        with pytest.raises(UserError) as info:
            average_checkpoints(sent, tmp_path / "avg", weights="uniform", delta_base=delta_base)
        assert not (tmp_path / "avg").exists()
        return str(info.value)

    assert "holds a change from another model than" in refused(delta_base=tmp_path / "other")
    assert "holds a change from a global model; give that model as the delta base" in refused(delta_base=None)
    weights = tmp_path / "sent-b" / "transfer.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # same size, one byte changed: only the sha256 tells
    weights.write_bytes(bytes(data))
    assert "transfer.safetensors does not match its model manifest (sha256)" in refused(delta_base=tmp_path / "base")
    weights.write_bytes(bytes(data[:-7]))
    message = refused(delta_base=tmp_path / "base")
    assert "transfer.safetensors" in message and "the transfer package is damaged, send it again" in message


def test_transfer_settings_are_checked_with_the_federation(tmp_path):
    config = {
        "rounds": 2,
        "sites": [{"name": "a"}, {"name": "b"}],
        "executor": "streamflow",
        "aggregation": {"lora": "merged"},
        "transfer": {"dtype": "int8", "block_size": 12},
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    text = str(info.value)
    assert "transfer.block_size: must be a multiple of 8 from 8 to 65536 (64 is usual), got 12" in text
    assert "transfer.dtype: int8 quantises a change, not a model (weights lose too much in 8 bits)" in text
    assert "set transfer.delta: true" in text
    assert "transfer: not supported with executor: streamflow yet" in text
    config.update(executor="builtin", transfer={"delta": True})
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError, match="transfer.delta: with aggregation.lora: merged every round starts a fresh adapter"
    ):
        load_federation(path)


def test_lora_adapters_travel_as_packages_and_average_into_an_adapter(tmp_path):
    """A LoRA federation (aggregation.lora: adapters) sends only its adapter: its change from the global
    adapter, packed, averages into an adapter directory that peft loads (adapter_model.safetensors and
    its adapter_config.json)."""
    from supertune.averaging.inputs import resolve_input

    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}
    names = [f"base_model.model.model.layers.0.self_attn.q_proj.lora_{x}.weight" for x in "AB"]
    rng = np.random.default_rng(0)

    def adapter(directory: Path, like: dict | None = None) -> dict:
        directory.mkdir()
        t = {
            names[0]: rng.standard_normal((4, 512)).astype(np.float32),
            names[1]: rng.standard_normal((512, 4)).astype(np.float32),
        }
        t = {k: like[k] + 0.01 * v for k, v in t.items()} if like else t
        save_file(t, str(directory / "adapter_model.safetensors"))
        (directory / "adapter_config.json").write_text(json.dumps(config))
        return t

    g = adapter(tmp_path / "global")
    sites = [adapter(tmp_path / n, like=g) for n in ("a", "b")]
    for n in ("a", "b"):
        inp = resolve_input(tmp_path / n)
        write_package(tmp_path / f"sent-{n}", inp.weights, Codec("int4", 8), base=resolve_input(tmp_path / "global").weights,
                      side_files=[inp.directory / f for f in inp.side_files])  # fmt: skip
        # int4 in blocks of 8: a byte a value (half a byte and a float32 scale per 8), a quarter of float32
        assert (
            read_package(tmp_path / f"sent-{n}").sent_weight_bytes
            < 0.3 * (tmp_path / n / "adapter_model.safetensors").stat().st_size
        )
    average_checkpoints(
        [tmp_path / "sent-a", tmp_path / "sent-b"], tmp_path / "avg", weights="uniform", delta_base=tmp_path / "global"
    )
    assert json.loads((tmp_path / "avg" / "adapter_config.json").read_text()) == config
    out = load_file(str(tmp_path / "avg" / "adapter_model.safetensors"))
    for k in names:  # int4 of a 0.01-sized change in blocks of 8: within half a block's scale, 0.01 * 4 / 7 / 2 at most
        assert np.abs(out[k] - (sites[0][k] + sites[1][k]) / 2).max() < 0.003
