"""Differential privacy of what sites send (docs/federated/privacy.md): a change beyond privacy.clip_norm
is clipped to it and one within is sent as it is; each of n sites' noise has the standard deviation
z C / sqrt(n), so that their sum carries z C; the epsilon of the accountant is the Gaussian mechanism's,
computed here from its RDP formula; with no noise and a clip norm no change reaches, a round averages
to the plain federation's global model, bit for bit; a federation of 2 sites x 2 rounds tables the
epsilon it spent, and killed while a site's noised change is written it resumes to the same global
model, bit for bit; the settings privacy does not compose with are refused, all at once."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file, save_file

from federation_cli import corpus_sites, federate_cli
from federation_copies import copy_before_average, copy_through_round_one_training
from supertune.config.errors import ConfigError
from supertune.federation.config.load import load_federation
from supertune.federation.config.privacy import site_noise_std
from supertune.federation.config.schema import FederationConfig, PrivacyConfig, SiteConfig
from supertune.federation.reports.epsilon import epsilon_after
from supertune.transfer import ChangeNoise, Codec, write_package
from supertune.transfer import package as package_module
from supertune.weight_files.tensor_files import WeightFiles

SHAPES = {"w": (300, 41), "b": (41,), "e": (7, 300)}


def _model(directory: Path, tensors: dict[str, np.ndarray]) -> WeightFiles:
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "model.safetensors"))
    return WeightFiles(directory, "model.safetensors")


def _pair(tmp_path: Path, norm: float, shapes: dict = SHAPES) -> tuple[WeightFiles, WeightFiles, dict]:
    """A base model and a site's model whose change from it has L2 norm `norm` over all its tensors."""
    rng = np.random.default_rng(3)
    base = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    change = {n: rng.standard_normal(s) for n, s in shapes.items()}
    scale = norm / math.sqrt(sum(float((c**2).sum()) for c in change.values()))
    site = {n: (base[n] + change[n] * scale).astype(np.float32) for n in shapes}
    sent = {n: site[n].astype(np.float64) - base[n] for n in shapes}  # as float32 stores it
    return _model(tmp_path / "base", base), _model(tmp_path / "site", site), sent


def _sent(directory: Path) -> dict[str, np.ndarray]:
    """The change a package of codec `same` holds: its float32 values as they are, in their shapes."""
    tensors = json.loads((directory / "supertune-transfer.json").read_text())["tensors"]
    stored = load_file(str(directory / "transfer.safetensors"))
    return {n: stored[n].astype(np.float64).reshape(t["shape"]) for n, t in tensors.items()}


def _norm(tensors: dict[str, np.ndarray]) -> float:
    return math.sqrt(sum(float((t.astype(np.float64) ** 2).sum()) for t in tensors.values()))


@pytest.mark.parametrize("norm", [7.5, 0.3], ids=["beyond-the-clip-norm", "within-it"])
def test_a_change_beyond_the_clip_norm_is_clipped_to_it_and_one_within_is_sent_as_it_is(
    tmp_path: Path, norm: float
) -> None:
    base, site, change = _pair(tmp_path, norm)
    privacy = ChangeNoise(clip_norm=2.0, noise_std=0.0, key=b"k" * 32)
    package = write_package(tmp_path / "sent", site, Codec("same"), base=base, privacy=privacy)
    sent = _sent(tmp_path / "sent")
    assert privacy.norm == pytest.approx(_norm(change), rel=1e-6)
    if norm > 2.0:
        assert _norm(sent) == pytest.approx(2.0, rel=1e-5)
        for n in SHAPES:  # scaled, not cut: the direction is kept
            assert np.allclose(sent[n], change[n] * 2.0 / _norm(change), rtol=0, atol=1e-6)
    else:
        assert all(np.array_equal(sent[n].astype(np.float32), change[n].astype(np.float32)) for n in SHAPES)
    # The package says how it was made, and never the change's norm: that is the site's to know.
    assert package.privacy == {"clip_norm": 2.0, "noise_std": 0.0}
    assert str(round(norm, 3)) not in (tmp_path / "sent" / "supertune-transfer.json").read_text()


def test_each_sites_noise_makes_the_sum_of_the_round_carry_z_times_the_clip_norm(tmp_path: Path, monkeypatch) -> None:
    """4 sites, z = 1.5, C = 2: each adds N(0, (zC)^2 / 4) to every value, the sum of the four N(0, (zC)^2)."""
    sites = [SiteConfig(name=f"s{i}") for i in range(4)]
    fed = FederationConfig(sites=sites, privacy=PrivacyConfig(clip_norm=2.0, noise_multiplier=1.5))
    std = site_noise_std(fed, 1)
    assert std == pytest.approx(1.5 * 2.0 / 2)
    shapes = {"big": (1100, 1000)}  # more values than one noise chunk (2^20)
    total = np.zeros(1_100_000)
    for i in range(4):
        base, site, _ = _pair(tmp_path / f"s{i}", 0.0, shapes)  # no change: the package is the noise
        write_package(tmp_path / f"s{i}" / "sent", site, Codec("same"), base=base,
                      privacy=ChangeNoise(2.0, std, key=bytes([i]) * 32))  # fmt: skip
        noise = _sent(tmp_path / f"s{i}" / "sent")["big"].reshape(-1)
        assert abs(noise.std() / std - 1) < 0.01 and abs(noise.mean()) < 0.01 * std
        total += noise
    assert abs(total.std() / (1.5 * 2.0) - 1) < 0.01
    # The same key draws the same noise whatever the slices the package is written in (int8 reads its
    # change twice: once for the scales, once for the values); another key, other noise.
    monkeypatch.setattr(package_module, "SLICE", 4096)
    base, site, _ = _pair(tmp_path / "again", 0.0, shapes)
    write_package(
        tmp_path / "again" / "sent", site, Codec("same"), base=base, privacy=ChangeNoise(2.0, std, b"\0" * 32)
    )
    assert np.array_equal(_sent(tmp_path / "again" / "sent")["big"], _sent(tmp_path / "s0" / "sent")["big"])
    assert not np.array_equal(_sent(tmp_path / "s1" / "sent")["big"], _sent(tmp_path / "s0" / "sent")["big"])


def test_an_int8_package_encodes_the_noised_change_and_keeps_what_it_lost_of_it(tmp_path: Path) -> None:
    """Error feedback keeps only what the codec lost of the noised change: decoded + residual is the
    clipped change plus the noise, so nothing of the unnoised change stays behind to be sent later."""
    from transfer_decoding import decoded_change

    base, site, change = _pair(tmp_path, 5.0)
    write_package(tmp_path / "a", site, Codec("int8", 64), base=base, privacy=ChangeNoise(1.0, 0.01, b"a" * 32))
    write_package(tmp_path / "b", site, Codec("same"), base=base, privacy=ChangeNoise(1.0, 0.01, b"a" * 32))
    decoded, residual, exact = decoded_change(tmp_path / "a", 64), load_file(str(tmp_path / "a" / "residual.safetensors")), _sent(tmp_path / "b")  # fmt: skip
    for n in SHAPES:
        assert np.allclose(decoded[n] + residual[n], exact[n], rtol=0, atol=1e-6), n


def _rdp_epsilon(z: float, rounds: int, delta: float) -> float:
    """The Gaussian mechanism's epsilon, from its RDP (Mironov 2017: alpha / (2 z^2) a round, adding up
    over rounds) and the conversion of Balle et al. 2020 (Theorem 21), minimised over a fine grid of orders."""
    alphas = np.concatenate([np.linspace(1.01, 10, 9000), np.linspace(10, 2000, 20000)])
    rdp = rounds * alphas / (2 * z * z)
    eps = rdp + np.log((alphas - 1) / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(eps.min())


@pytest.mark.parametrize(("z", "rounds", "delta"), [(1.0, 2, 1e-5), (0.5, 10, 1e-5), (2.0, 3, 1e-6), (4.0, 1, 1e-5)])
def test_the_accountants_epsilon_is_the_gaussian_mechanisms(z: float, rounds: int, delta: float) -> None:
    spent = epsilon_after([z] * rounds, delta)
    # The accountant searches fewer orders than the grid here: never below it, and close.
    expected = _rdp_epsilon(z, rounds, delta)
    assert expected * (1 - 1e-9) <= spent <= expected * 1.02, (spent, expected)
    # More rounds spend more; a round without noise has no bound.
    assert epsilon_after([z] * (rounds + 1), delta) > spent
    assert math.isinf(epsilon_after([z, 0.0], delta)) and epsilon_after([], delta) == 0.0


def test_what_privacy_does_not_compose_with_is_refused_all_at_once(tmp_path: Path, monkeypatch) -> None:
    config = {
        "mode": "buffered",
        "sites": [{"name": "a", "weight": 2.0}, {"name": "b", "weight": 1.0}],
        "privacy": {"noise_multiplier": -1, "delta": 1.5},
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    text = str(info.value)
    for expected in (
        "privacy.noise_multiplier: must be 0 or more (1 is usual), got -1",
        "privacy.clip_norm: noise_multiplier needs the norm each site's change is clipped to",
        "privacy.delta: must be in (0, 1) (1e-5 is usual), got 1.5",
        "privacy: clips and noises each site's change, which is sent only with transfer.delta: true; set it",
        "privacy: the noise covers one site's change only when every site counts the same; set aggregation.weights: uniform",
        "privacy: not supported with mode: buffered yet; use mode: synchronous",
    ):
        assert expected in text, (expected, text)
    config = {
        "executor": "streamflow",
        "sites": [{"name": "a"}, {"name": "b"}],
        "transfer": {"delta": True},
        "privacy": {"clip_norm": 0},
    }
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    text = str(info.value)
    assert "privacy.clip_norm: must be a positive number (the L2 norm of a site's change), got 0" in text
    assert "privacy: the noise covers one site's change only when every site counts the same" in text  # tokens
    # Without Opacus, one line says what to install.
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "opacus" else found(name, *a))
    config.update(executor="builtin", aggregation={"weights": "uniform"}, privacy={"clip_norm": 1.0})
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    assert (
        str(info.value)
        .splitlines()[-1]
        .endswith(
            "privacy: the epsilon accountant needs Opacus, which is not installed here: pip install 'opacus==1.6.0' "
            "(or supertune[privacy])"
        )
    )
    # LoRA sites: refused with the sites' run configs.
    from supertune.config.schema import RunConfig
    from supertune.federation.config.lora_modes import lora_problems

    lora = RunConfig()
    lora.model.lora.enabled = True
    fed = FederationConfig(sites=[SiteConfig(name="a"), SiteConfig(name="b")], privacy=PrivacyConfig(clip_norm=1.0))
    assert lora_problems(fed, ["a", "b"], [lora, lora]) == [
        "model.lora.enabled: LoRA sites are not supported with privacy yet; train the whole model, or leave privacy out"
    ]


# -- a federation -----------------------------------------------------------------------------------

Z, CLIP, DELTA = 1.0, 0.5, 1e-5


def _config(**extra) -> dict:
    return {"name": "private", "base_config_overrides": {"num_hidden_layers": 1}, "rounds": 2, "sites": corpus_sites(2),
            "transfer": {"delta": True}, "aggregation": {"weights": "uniform"},
            "privacy": {"clip_norm": CLIP, "noise_multiplier": Z, "delta": DELTA}, **extra}  # fmt: skip


def test_the_dry_run_says_what_each_site_does_to_its_change(tmp_path: Path, capsys) -> None:
    from supertune.cli.main import main

    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    assert main(["federate", str(tmp_path / "federation.yaml"), "--dry-run", "--dir", str(tmp_path / "fed")]) == 0
    out = capsys.readouterr().out
    assert (
        f"# privacy: each site's change clipped to L2 norm {CLIP:g} and noised at the site (noise multiplier {Z:g}: "
        f"the round's sum carries std {Z * CLIP:g} a value); epsilon reported at delta {DELTA:g}"
    ) in out.splitlines()
    assert not (tmp_path / "fed").exists()


def _global(fed: Path, number: int) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted((fed / f"round-{number:03d}" / "global").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and bool(a) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def private(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("private")
    (root / "federation.yaml").write_text(yaml.safe_dump(_config(), sort_keys=False))
    proc = federate_cli(str(root / "federation.yaml"), "--dir", str(root / "fed"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "site-a round 1: its change's L2 norm" in proc.stderr
    return root / "fed"


@pytest.mark.slow
def test_a_private_federation_tables_the_epsilon_it_spent(private: Path) -> None:
    table = json.loads((private / "rounds.json").read_text())
    one, two = epsilon_after([Z], DELTA), epsilon_after([Z, Z], DELTA)
    assert [r["round"] for r in table["rows"]] == [1, 1, 2, 2]
    assert [r["epsilon"] for r in table["rows"]] == pytest.approx([one, one, two, two], rel=1e-9)
    assert 0 < one < two
    for number in (1, 2):
        rd = private / f"round-{number:03d}"
        averaged = json.loads((rd / "averaged.json").read_text())
        # each of the 2 sites noised its change with z C / sqrt(2): the sum carries z C
        assert averaged["privacy"] == {
            "clip_norm": CLIP,
            "noise_std": {s: Z * CLIP / math.sqrt(2) for s in ("site-a", "site-b")},
        }
        # the global model is the previous one plus the mean of what the sites sent, nothing else
        previous, now = _global(private, number - 1), _global(private, number)
        sent = [_sent(rd / s / "sent") for s in ("site-a", "site-b")]
        for n in now:
            assert np.allclose(now[n], previous[n] + (sent[0][n] + sent[1][n]) / 2, rtol=0, atol=1e-6), n
    markdown = (private / "rounds.md").read_text()
    assert "| sent MB | received MB | epsilon | note |" in markdown
    assert f"| {two:.3f} |  |" in markdown
    assert (
        f"privacy: epsilon {two:.3f} at delta 1e-05 spent through round 2 (clip_norm 0.5, noise_multiplier 1;"
        in markdown
    )
    status = federate_cli("--status", str(private))
    assert status.returncode == 0 and status.stdout == markdown
    # each site's key: readable by its owner only, never among what it sent
    for site in ("site-a", "site-b"):
        key = private / "privacy" / f"{site}.key"
        assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
        manifest = json.loads((private / "round-001" / site / "sent" / "supertune-transfer.json").read_text())
        assert f"{site}.key" not in manifest["files"]


@pytest.mark.slow
def test_a_federation_killed_while_a_noised_change_is_written_resumes_to_the_same_global_model(
    private: Path, tmp_path: Path
) -> None:
    """A copy as it stood after round 1's training, before its packages: killed in the middle of the
    first package's tensors, then resumed, its packages and global model are the uninterrupted ones."""
    from supertune.federation.run import federate

    fed = tmp_path / "fed"
    copy_before_average(private, fed, 1)
    for site in ("site-a", "site-b"):
        shutil.rmtree(fed / "round-001" / site / "sent")
    killed = federate_cli(str(fed), env={"SUPERTUNE_FAULT": "transfer.tensor@3"})
    assert killed.returncode != 0 and not (fed / "round-001" / "averaged.json").exists()
    federate(str(fed), None)
    for site in ("site-a", "site-b"):
        for f in ("transfer.safetensors", "supertune-transfer.json"):
            assert (fed / "round-001" / site / "sent" / f).read_bytes() == (
                private / "round-001" / site / "sent" / f
            ).read_bytes()
    assert _same(_global(fed, 1), _global(private, 1))


@pytest.mark.slow
def test_no_noise_and_a_clip_norm_no_change_reaches_average_as_the_plain_federation(
    private: Path, tmp_path: Path
) -> None:
    """Round 1's training, averaged again without privacy and with noise_multiplier 0 and clip_norm 1e6:
    the same global model, bit for bit; the table says the second spent no privacy it can bound."""
    from supertune.federation.run import federate

    made = {}
    for name, privacy in (("plain", {}), ("unnoised", {"clip_norm": 1e6, "noise_multiplier": 0.0})):
        fed = tmp_path / name
        copy_through_round_one_training(private, fed, {})
        shutil.rmtree(fed / "privacy")
        config = yaml.safe_load((fed / "federation.yaml").read_text())
        config["privacy"] = privacy
        (fed / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        for site in ("site-a", "site-b"):
            shutil.rmtree(fed / "round-001" / site / "sent")
        federate(str(fed), None)
        made[name] = _global(fed, 1)
    assert _same(made["plain"], made["unnoised"])
    assert not _same(made["plain"], _global(private, 1))  # the private federation's noise did reach its model
    table = json.loads((tmp_path / "unnoised" / "rounds.json").read_text())
    assert [r["epsilon"] for r in table["rows"]] == [None, None]
    assert "| inf |" in (tmp_path / "unnoised" / "rounds.md").read_text()


def test_a_noise_key_others_can_read_or_that_another_user_owns_is_refused(tmp_path: Path) -> None:
    """The site's secret is made once, mode 0600, and read again as it is (the same noise after a
    resume); one that others can read, or that belongs to another user, is refused in one line."""
    from supertune.errors import UserError
    from supertune.federation.state.layout import FederationDir
    from supertune.federation.state.noise_key import site_noise_key

    root = FederationDir(tmp_path)
    key = site_noise_key(root, "site-a", 1, "abc")
    path = root.noise_key("site-a")
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
    assert site_noise_key(root, "site-a", 1, "abc") == key != site_noise_key(root, "site-a", 2, "abc")
    path.chmod(0o644)
    with pytest.raises(UserError) as readable:
        site_noise_key(root, "site-a", 1, "abc")
    assert str(readable.value) == f"privacy: the site's noise key {path} is readable by others; chmod 600 {path}"
    path.chmod(0o600)
    if os.getuid() == 0:  # only root can give a file away (CI's tests run as root)
        os.chown(path, 65534, -1)
        with pytest.raises(UserError, match=r"belongs to user 65534, not to this one \(0\)"):
            site_noise_key(root, "site-a", 1, "abc")
