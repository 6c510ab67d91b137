"""Sending less (docs/federated.md, "Sending less"): a site's model or change encoded into a transfer
package (its own dtype, bf16, fp16, blockwise int8), read back a slice at a time and averaged onto the
round's global model; error feedback sends in later rounds what int8 rounded away; a damaged package,
or one taken from another model, is refused; a federation whose sites send int8 changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file, save_file

from supertune.averaging import average_checkpoints
from supertune.config.errors import ConfigError
from supertune.errors import UserError
from supertune.federation.default import site_corpus
from supertune.federation.load import load_federation
from supertune.transfer import PACKAGE_MANIFEST, Codec, PackageWeights, read_package, write_package
from supertune.transfer import package as package_module
from supertune.weight_files.tensor_files import TensorFile, WeightFiles

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


def _decoded(package_dir: Path, block: int) -> dict[str, np.ndarray]:
    """The change an int8 or int4 package holds, decoded from the format as docs/federated.md states it
    (not through supertune): int4 packs (q + 8) of the even element in the low 4 bits, the odd in the high."""
    stored = load_file(str(package_dir / "transfer.safetensors"))
    manifest = json.loads((package_dir / PACKAGE_MANIFEST).read_text())
    out = {}
    for name, t in manifest["tensors"].items():
        numel = int(np.prod(t["shape"]))
        if t["dtype"] != "F32":
            out[name] = stored[name]
            continue
        q = stored[name]
        if manifest["codec"] == "int4":
            q = np.stack([q & 15, q >> 4], axis=1).reshape(-1).astype(np.int16) - 8
        scale = stored[name + ":absmax_scale"]
        out[name] = (q.astype(np.float32).reshape(-1, block) * scale[:, None]).reshape(-1)[:numel].reshape(t["shape"])
    return out


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
    decoded = _decoded(tmp_path / "sent", 16)
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
        decoded = _decoded(out, 8)
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
    da, db = _decoded(tmp_path / "sent-a", 32), _decoded(tmp_path / "sent-b", 32)
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


@pytest.mark.slow
def test_a_federation_whose_sites_send_int8_changes(tmp_path):
    """Two sites, two rounds: what each site sent is what the round averaged (the global model is the
    previous one plus the weighted decoded changes), round 2's change carries round 1's residual, the
    bytes in the table are the packages', and the packages are made again bit for bit."""
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", "generate.max_new_tokens=0",
                     "training.report_to=[]", "data.max_eval_samples=16", "training.warmup_steps=0"]  # fmt: skip
        sites.append({"name": name, "overrides": overrides, "steps_per_round": 4})
    config = {"name": "sendless", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 2, "sites": sites,
              "transfer": {"delta": True, "dtype": "int8", "block_size": 64}}  # fmt: skip
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    fed = tmp_path / "fed"
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(tmp_path / "federation.yaml"), "--dir", str(fed)],
        capture_output=True, text=True, env=dict(os.environ), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "site-a round 2: sends" in proc.stderr and "its change in int8" in proc.stderr

    def model(directory: Path) -> dict[str, np.ndarray]:
        out = {}
        for f in sorted(directory.glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    model_bytes = sum(f.stat().st_size for f in (fed / "round-000" / "global").glob("*.safetensors"))
    for number in (1, 2):
        rd = fed / f"round-{number:03d}"
        averaged = json.loads((rd / "averaged.json").read_text())
        previous, now = model(fed / f"round-{number - 1:03d}" / "global"), model(rd / "global")
        expected = {n: previous[n].astype(np.float64) for n in previous}
        for site in ("site-a", "site-b"):
            sent = rd / site / "sent"
            assert averaged["sent_bytes"][site] == (sent / "transfer.safetensors").stat().st_size
            assert averaged["sent_bytes"][site] < 0.27 * model_bytes  # fp32 model: int8 is ~1/4 of it
            for n, d in _decoded(sent, 64).items():
                expected[n] += averaged["weights"][site] * d
        assert max(float(np.abs(now[n] - expected[n]).max()) for n in now) < 1e-6
    # error feedback: round 2's change (decoded, plus what it kept) is the site's true change plus round 1's residual
    site = fed / "round-002" / "site-a"
    trained = json.loads((site / "trained.json").read_text())
    x = load_file(str(Path(trained["checkpoint"]) / "model.safetensors"))
    g1 = model(fed / "round-001" / "global")
    r1 = load_file(str(fed / "round-001" / "site-a" / "sent" / "residual.safetensors"))
    r2 = load_file(str(site / "sent" / "residual.safetensors"))
    d2 = _decoded(site / "sent", 64)
    assert max(float(np.abs(d2[n] + r2[n] - (x[n] - g1[n] + r1[n])).max()) for n in r2) < 1e-6
    assert max(float(np.abs(r1[n]).max()) for n in r1) > 0
    # A federation killed while a package is written (SIGKILL in the middle of its tensors) makes it
    # again from the same inputs, byte for byte: the half-written staging directory is cleared.
    table = json.loads((fed / "rounds.json").read_text())
    assert [r["sent_bytes"] for r in table["rows"]] == [averaged["sent_bytes"]["site-a"]] * 4
    again = fed / "again"
    (again / "round-002" / "site-a").mkdir(parents=True)
    (again / "round-001" / "site-a").mkdir(parents=True)
    os.symlink(fed / "round-001" / "site-a" / "sent", again / "round-001" / "site-a" / "sent")
    send = (
        "import sys; from pathlib import Path; from supertune.federation.layout import FederationDir; "
        "from supertune.federation.load import load_federation; from supertune.federation.site_result import send_result; "
        "fed, _ = load_federation(sys.argv[1]); "
        "send_result(fed, FederationDir(sys.argv[2]), 2, 'site-a', sys.argv[3], Path(sys.argv[4]))"
    )
    argv = [sys.executable, "-c", send, str(fed), str(again), trained["checkpoint"], str(fed / "round-001" / "global")]
    killed = subprocess.run(
        argv, env=dict(os.environ, SUPERTUNE_FAULT="transfer.tensor@5"), capture_output=True, timeout=300
    )
    assert killed.returncode == -9 and list((again / "round-002" / "site-a").glob(".sent.partial-*"))
    assert subprocess.run(argv, capture_output=True, timeout=300).returncode == 0
    assert not list((again / "round-002" / "site-a").glob(".sent.partial-*"))
    for f in ("transfer.safetensors", "residual.safetensors", PACKAGE_MANIFEST):
        assert (again / "round-002" / "site-a" / "sent" / f).read_bytes() == (site / "sent" / f).read_bytes(), f
    # --plan counts what the packages weigh: the values (headers of the base's files) x 1 + 4/64 bytes
    plan = subprocess.run([sys.executable, "-m", "supertune", "federate", str(fed), "--plan"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    planned = int(plan.stdout.split("each site sends its change in int8, ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < averaged["sent_bytes"]["site-a"] - planned < 4096, plan.stdout


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
