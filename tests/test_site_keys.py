"""A site's key pair for secure aggregation: made at the site mode 0600 and never overwritten, its public
key pinned in the federation config; an agent whose key is not private, or not the pinned one, is
refused in one line; and what `privacy.secure_aggregation` does not compose with is refused at once."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml

from federation_cli import federate_cli
from supertune.config.errors import ConfigError
from supertune.errors import UserError
from supertune.federation.config.load import load_federation
from supertune.federation.config.schema import FederationConfig, SiteConfig
from supertune.federation.state.site_key import agent_key, make_site_key, read_site_key
from supertune.transfer.secure_masks import public_key_text


def test_new_key_writes_a_private_key_mode_0600_prints_its_public_key_and_never_overwrites(tmp_path: Path) -> None:
    key = tmp_path / "leonardo.key"
    made = federate_cli("--site", "leonardo", str(tmp_path / "exchange"), "--new-key", str(key), timeout=120)
    assert made.returncode == 0, made.stderr
    public = made.stdout.strip()
    assert len(base64.b64decode(public, validate=True)) == 32
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    assert public_key_text(key.read_bytes()) == public
    assert f"--key {key}" in made.stderr and not (tmp_path / "exchange").exists()  # the exchange is not asked
    again = federate_cli("--site", "leonardo", "--new-key", str(key), timeout=120)
    assert again.returncode != 0
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .endswith(f"--new-key: the key file {key} exists; it is never overwritten: give a new file, or use that key")
    )
    assert public_key_text(key.read_bytes()) == public
    alone = federate_cli("--new-key", str(tmp_path / "other.key"), timeout=120)
    assert alone.stderr.strip().splitlines()[-1].endswith("--new-key: only with --site NAME (a site's key)")


def test_a_key_others_can_read_or_another_user_owns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "site.key"
    make_site_key(path)
    assert len(read_site_key(path)) == 32
    path.chmod(0o640)
    with pytest.raises(UserError) as readable:
        read_site_key(path)
    assert str(readable.value) == f"--key: the site's private key {path} is readable by others; chmod 600 {path}"
    path.chmod(0o600)
    if os.getuid() == 0:  # only root can give a file away (CI's tests run as root)
        os.chown(path, 65534, -1)
        with pytest.raises(
            UserError, match=r"belongs to user 65534, not to this one \(0\); run the agent as its owner"
        ):
            read_site_key(path)
    with pytest.raises(UserError, match="is not a file; make the site's key with supertune federate --site"):
        read_site_key(tmp_path / "missing.key")


def test_an_agent_whose_key_is_not_the_pinned_one_stops_naming_its_site(tmp_path: Path) -> None:
    own, other = tmp_path / "a.key", tmp_path / "other.key"
    pinned = {"a": make_site_key(own), "b": make_site_key(tmp_path / "b.key")}
    wrong = make_site_key(other)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    config = {
        "name": "pinned",
        "executor": "agents",
        "exchange": str(exchange),
        "sites": [{"name": n, "public_key": k} for n, k in pinned.items()],
    }
    (exchange / "federation.yaml").write_text(yaml.safe_dump(config))
    agent = federate_cli(
        "--site", "a", str(exchange), "--key", str(other), "--dir", str(tmp_path / "agent"), timeout=120
    )
    assert agent.returncode != 0
    assert (
        agent.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"sites (a).public_key: the federation pins {pinned['a']}, not {wrong}, the public key of --key {other}; "
            "run the agent with the key that made the pinned one, or pin this one"
        )
    )
    assert not (tmp_path / "agent").exists()  # refused before anything was written
    fed = FederationConfig(name="pinned", sites=[SiteConfig(name=n, public_key=k) for n, k in pinned.items()])
    assert agent_key(fed, fed.sites[0], str(own)) == own.read_bytes()
    assert agent_key(fed, fed.sites[0], None) is None
    fed.privacy.secure_aggregation = True
    with pytest.raises(UserError, match=r"--key: federation pinned masks the sites' changes"):
        agent_key(fed, fed.sites[0], None)


def test_what_secure_aggregation_does_not_compose_with_is_refused_all_at_once(tmp_path: Path) -> None:
    key = make_site_key(tmp_path / "a.key")
    config = {
        "mode": "buffered",
        "rounds": 2,
        "aggregation": {"min_sites": 1},
        "sites": [{"name": "a"}, {"name": "b", "from_round": 2}, {"name": "c", "from_round": 2, "public_key": "AAAA"}],
        "transfer": {"delta": True, "dtype": "bf16"},
        "privacy": {"secure_aggregation": True, "clip_norm": 1.0},
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    text = str(info.value)
    for expected in (
        "sites[2] (c).public_key: 'AAAA' is 3 bytes, not the 32 of an X25519 public key; "
        "pin what `supertune federate --site c EXCHANGE --new-key KEYFILE` printed",
        "sites[2] (c).public_key: only used with executor: agents; remove it or set executor: agents",
        "privacy.secure_aggregation: executor builtin does not mask the sites' changes; use executor: agents",
        "aggregation.min_sites: 1 with privacy.secure_aggregation would average one site's change alone, which the "
        "sum is then; set it to 2 or more",
        "privacy.secure_aggregation: clipping and noise (privacy.clip_norm, noise_multiplier) are not carried",
        "sites[].public_key: privacy.secure_aggregation needs every site's pinned key, missing for a, b;",
        "privacy.secure_aggregation: the masked sum adds a change's blockwise integers; "
        "set transfer.delta: true and transfer.dtype: int8 (or int4)",
        "privacy.secure_aggregation: not supported with mode: buffered yet; use mode: synchronous",
        "privacy.secure_aggregation: round 1 has one site (sites[].from_round/until_round)",
    ):
        assert expected in text, (expected, text)
    # The agents executor with every key pinned, int8 changes: it carries the masked sum.
    config = {
        "executor": "agents",
        "exchange": str(tmp_path / "exchange"),
        "sites": [{"name": "a", "public_key": key}, {"name": "b", "public_key": key}],
        "transfer": {"delta": True, "dtype": "int8"},
        "privacy": {"secure_aggregation": True},
    }
    path.write_text(yaml.safe_dump(config))
    fed, _ = load_federation(path)
    assert fed.privacy.secure_aggregation and fed.sites[0].public_key == key
