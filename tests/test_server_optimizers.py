"""The server optimizers (FedAvgM, Nesterov, FedAdam, FedYogi, FedAdagrad) against references written
here from the papers' equations in plain torch on the state dicts, over 3 rounds, each round a
separate average that reads the previous round's state from disk; a SIGKILL in the middle of an
average with state resumes to the same bytes; the federation's round average passes its settings on.

References: Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, with
Delta_t = mean of the sites' x_i - x_t, m_-1 = 0 and v_-1 = tau^2; DiLoCo's outer step (Douillard et
al., 2023) is torch.optim.SGD(nesterov=True) on the outer gradient x_t - mean x_i, and FedAvgM
(Hsu et al., 2019) torch.optim.SGD with momentum on the same outer gradient."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from average_models import make_checkpoint, save_model
from supertune.averaging import ServerStep, average_checkpoints

ROUNDS = 3
WEIGHTS = [(100, 300), (200, 200), (500, 100)]  # tokens of the two sites in each round
SETTINGS = {
    "fedavgm": {"lr": 0.7, "momentum": 0.9},
    "nesterov": {"lr": 0.7, "momentum": 0.9},
    "fedadam": {"lr": 0.05, "momentum": 0.8, "beta2": 0.95, "tau": 0.01},
    "fedyogi": {"lr": 0.05, "momentum": 0.8, "beta2": 0.95, "tau": 0.01},
    "fedadagrad": {"lr": 0.05, "momentum": 0.8, "tau": 0.01},
}


def _state_dict(directory: Path, name: str | None = None) -> dict[str, torch.Tensor]:
    files = [directory / name] if name else sorted(f for f in directory.glob("model*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update({k: v.to(torch.float32) for k, v in load_file(f).items()})
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[Path]]]:
    """A start model and, for each of 3 rounds, two site models with token counts (a checkpoint manifest)."""
    root = tmp_path_factory.mktemp("server-optimizers")
    start = save_model(root / "g0", 0)
    rounds = []
    for r, counts in enumerate(WEIGHTS):
        sites = [save_model(root / f"r{r}-{i}", 10 * r + i + 1) for i in range(2)]
        for site, tokens in zip(sites, counts, strict=True):
            make_checkpoint(site, tokens=tokens, samples=1)
        rounds.append(sites)
    return start, rounds


def _reference(optimizer: str, start: Path, rounds: list[list[Path]]) -> list[tuple[dict, dict, dict]]:
    """(global model, first moment, second moment) after each round, from the equations."""
    s = {"beta2": 0.99, "tau": 1e-3, **SETTINGS[optimizer]}
    lr, b1, b2, tau = s["lr"], s["momentum"], s["beta2"], s["tau"]
    x = _state_dict(start)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in x.items()}
    sgd = torch.optim.SGD(params.values(), lr=lr, momentum=b1, nesterov=optimizer == "nesterov")
    m = {k: torch.zeros_like(v) for k, v in x.items()}
    v = {k: torch.full_like(t, tau**2) for k, t in x.items()}
    out = []
    for sites, counts in zip(rounds, WEIGHTS, strict=True):
        ws = [c / sum(counts) for c in counts]
        loaded = [_state_dict(site) for site in sites]
        mean = {k: sum(w * t[k] for w, t in zip(ws, loaded, strict=True)) for k in x}
        if optimizer in ("fedavgm", "nesterov"):
            for k, p in params.items():
                p.grad = p.detach() - mean[k]  # the outer gradient: minus the averaged change
            sgd.step()
            x = {k: p.detach().clone() for k, p in params.items()}
            # torch keeps the momentum of the outer gradient; the state on disk is that of the change
            m = {k: -sgd.state[p]["momentum_buffer"] for k, p in params.items()}
        else:
            for k in x:
                delta = mean[k] - x[k]
                m[k] = b1 * m[k] + (1 - b1) * delta
                if optimizer == "fedadam":
                    v[k] = b2 * v[k] + (1 - b2) * delta**2
                elif optimizer == "fedyogi":
                    v[k] = v[k] - (1 - b2) * delta**2 * torch.sign(v[k] - delta**2)
                else:
                    v[k] = v[k] + delta**2
                x[k] = x[k] + lr * m[k] / (torch.sqrt(v[k]) + tau)
        out.append(({k: t.clone() for k, t in x.items()}, dict(m), dict(v)))
    return out


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=2e-5, atol=1e-6, msg=lambda m, k=k: f"{what} {k}: {m}")


@pytest.mark.parametrize("optimizer", list(SETTINGS))
def test_three_rounds_match_the_papers_equations(optimizer: str, models, tmp_path: Path) -> None:
    start, rounds = models
    want = _reference(optimizer, start, rounds)
    previous = start
    for r, sites in enumerate(rounds):
        out = tmp_path / f"g{r + 1}"
        manifest = average_checkpoints(
            sites, out, server=ServerStep(global_model=previous, optimizer=optimizer, **SETTINGS[optimizer])
        )
        x, m, v = want[r]
        _assert_close(_state_dict(out), x, f"{optimizer} round {r + 1} global")
        _assert_close(_state_dict(out, "server-momentum.safetensors"), m, f"{optimizer} round {r + 1} first moment")
        adaptive = optimizer in ("fedadam", "fedyogi", "fedadagrad")
        second = out / "server-second-moment.safetensors"
        assert second.is_file() == adaptive
        if adaptive:
            _assert_close(_state_dict(out, second.name), v, f"{optimizer} round {r + 1} second moment")
        assert manifest.server["optimizer"] == optimizer
        if r:
            assert manifest.server["momentum_in"]["path"] == str(previous / "server-momentum.safetensors")
        previous = out
    # the round moved away from plain FedAvg (the settings are used, not ignored)
    plain = tmp_path / "plain"
    average_checkpoints(rounds[0], plain)
    assert not torch.allclose(_state_dict(plain)["lm_head.weight"], want[0][0]["lm_head.weight"], atol=1e-4)


def test_plain_fedavgm_keeps_no_state_and_the_defaults_are_the_papers(models, tmp_path: Path) -> None:
    start, rounds = models
    step = ServerStep(global_model=start)
    assert (step.server_lr, step.server_momentum) == (1.0, 0.0)
    average_checkpoints(rounds[0], tmp_path / "fedavg", server=step)
    assert not list((tmp_path / "fedavg").glob("server-*"))
    adam = ServerStep(global_model=start, optimizer="fedadam")
    assert (adam.server_lr, adam.server_momentum, adam.beta2, adam.tau) == (0.01, 0.9, 0.99, 1e-3)
    nesterov = ServerStep(global_model=start, optimizer="nesterov")
    assert (nesterov.server_lr, nesterov.server_momentum) == (0.7, 0.9)  # DiLoCo's outer settings


def test_one_optimizers_state_is_not_read_as_anothers(models, tmp_path: Path, capsys) -> None:
    from supertune.cli.main import main

    start, rounds = models
    g1 = tmp_path / "g1"
    average_checkpoints(rounds[0], g1, server=ServerStep(global_model=start, optimizer="fedavgm", momentum=0.9))
    code = main(["average", *map(str, rounds[1]), "--out", str(tmp_path / "g2"), "--global-model", str(g1),
                 "--server-optimizer", "fedadam"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not (tmp_path / "g2").exists()
    assert "holds the state of server optimizer fedavgm, not fedadam; use --server-optimizer fedavgm" in err
    # a first moment given without its second moment beside it is refused too, naming the file
    g1a = tmp_path / "g1a"
    average_checkpoints(rounds[0], g1a, server=ServerStep(global_model=start, optimizer="fedyogi"))
    alone = tmp_path / "state" / "m.safetensors"
    alone.parent.mkdir()
    alone.write_bytes((g1a / "server-momentum.safetensors").read_bytes())
    code = main(["average", *map(str, rounds[1]), "--out", str(tmp_path / "g2"), "--global-model", str(g1a),
                 "--server-optimizer", "fedyogi", "--server-tau", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--server-tau: 0.0 must be a positive number" in err
    code = main(["average", *map(str, rounds[1]), "--out", str(tmp_path / "g2"), "--global-model", str(g1a),
                 "--server-optimizer", "fedyogi", "--momentum-in", str(alone)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "belongs beside it as m.second-moment.safetensors and is missing; give both files" in err


def _sha256(directory: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.glob("*.safetensors"))}


def test_an_average_killed_mid_way_resumes_to_the_same_model_and_state(models, tmp_path: Path) -> None:
    """Round 2 of FedYogi (it reads round 1's state and writes its own), killed with SIGKILL after
    three tensors and run again, writes the bytes an uninterrupted run writes."""
    start, rounds = models
    g1 = tmp_path / "g1"
    average_checkpoints(rounds[0], g1, server=ServerStep(global_model=start, optimizer="fedyogi"))
    argv = [sys.executable, "-m", "supertune", "average", *map(str, rounds[1]), "--global-model", str(g1),
            "--server-optimizer", "fedyogi", "--max-shard-size", "20KB", "--out"]  # fmt: skip
    env = dict(os.environ)
    clean = subprocess.run([*argv, str(tmp_path / "clean")], capture_output=True, text=True, env=env)
    assert clean.returncode == 0, clean.stderr
    killed = subprocess.run(
        [*argv, str(tmp_path / "g2")],
        capture_output=True,
        text=True,
        env={**env, "SUPERTUNE_FAULT": "average.tensor@3"},
    )
    assert killed.returncode != 0 and not (tmp_path / "g2").exists()
    resumed = subprocess.run([*argv, str(tmp_path / "g2")], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    got, want = _sha256(tmp_path / "g2"), _sha256(tmp_path / "clean")
    assert len(want) > 3 and "server-second-moment.safetensors" in want and got == want


def test_the_federations_round_average_uses_its_server_optimizer(models, tmp_path: Path) -> None:
    """Three rounds of a federation's average with FedAdam: each round's state beside its global model,
    read by the next round; the result is the reference's."""
    from supertune.federation.config.schema import AggregationConfig, FederationConfig, SiteConfig
    from supertune.federation.rounds.phases import average_round

    start, rounds = models
    s = SETTINGS["fedadam"]
    fed = FederationConfig(
        aggregation=AggregationConfig(
            server_optimizer="fedadam",
            server_lr=s["lr"],
            server_momentum=s["momentum"],
            server_beta2=s["beta2"],
            server_tau=s["tau"],
        ),
        sites=[SiteConfig(name="a"), SiteConfig(name="b")],
    )
    previous = start
    for r, sites in enumerate(rounds):
        out = tmp_path / f"round-{r + 1}"
        average_round(fed, r + 1, ["a", "b"], list(map(str, sites)), previous, out, tmp_path / f"averaged-{r}.json")
        previous = out
    x, m, v = _reference("fedadam", start, rounds)[-1]
    _assert_close(_state_dict(previous), x, "federation round 3 global")
    _assert_close(_state_dict(previous, "server-second-moment.safetensors"), v, "federation round 3 second moment")


def test_every_record_is_tested_against_its_reference() -> None:
    """A new optimizer's record comes with its reference in SETTINGS (and _reference) above."""
    from supertune.averaging.server_optimizers import SERVER_OPTIMIZERS

    assert sorted(SERVER_OPTIMIZERS) == sorted(SETTINGS)


def test_the_docs_table_is_the_registry(repo: Path) -> None:
    """docs/federated/server-optimizers.md's table of server optimizers is the one their records
    generate, and names each record's defaults."""
    from supertune.averaging.server_optimizer_docs import server_optimizers_markdown
    from supertune.averaging.server_optimizers import SERVER_OPTIMIZERS

    table = server_optimizers_markdown()
    assert table in (repo / "docs" / "federated" / "server-optimizers.md").read_text(encoding="utf-8"), (
        "docs/federated/server-optimizers.md: replace the block between the server optimizers markers with "
        "supertune.averaging.server_optimizer_docs.server_optimizers_markdown()"
    )
    rows = [line for line in table.splitlines() if line.startswith("| `") and "state (float32)" not in line]
    assert [row.split("`")[1] for row in rows] == list(SERVER_OPTIMIZERS)
    for row, o in zip(rows, SERVER_OPTIMIZERS.values(), strict=True):
        assert f"| {o.lr:g} | {o.momentum:g}" in row


def test_the_config_and_the_command_line_offer_the_registrys_names(tmp_path: Path) -> None:
    """A federation's aggregation.server_optimizer and `supertune average --server-optimizer` take the
    records' names, and refuse another in one line naming the field and every valid name."""
    import yaml

    from supertune.averaging.server_optimizers import SERVER_OPTIMIZERS
    from supertune.cli.main import build_parser
    from supertune.config.errors import ConfigError
    from supertune.federation.config.load import load_federation

    names = list(SERVER_OPTIMIZERS)
    path = tmp_path / "federation.yaml"
    sites = [{"name": "a"}, {"name": "b"}]
    for name in names:
        path.write_text(yaml.safe_dump({"sites": sites, "aggregation": {"server_optimizer": name}}), encoding="utf-8")
        fed, _ = load_federation(path)
        assert fed.aggregation.server_optimizer == name
        assert fed.aggregation.server_lr == SERVER_OPTIMIZERS[name].lr
    path.write_text(yaml.safe_dump({"sites": sites, "aggregation": {"server_optimizer": "fedadamw"}}), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_federation(path)
    (line,) = [p for p in refused.value.problems if "server_optimizer" in p]
    assert line.startswith("aggregation.server_optimizer: 'fedadamw' is not one of " + ", ".join(names))
    parser = build_parser()
    args = parser.parse_args(
        ["average", "a", "b", "--out", "c", "--global-model", "g", "--server-optimizer", names[-1]]
    )
    assert args.server_optimizer == names[-1]
    with pytest.raises(SystemExit):
        parser.parse_args(["average", "a", "b", "--out", "c", "--server-optimizer", "fedadamw"])


def test_the_server_keys_reference_says_what_the_registry_holds() -> None:
    """The schema's docstrings of aggregation.server_* (`--help`, docs/config.md) are prose, written by
    hand: each names every optimizer with the defaults and the settings its record holds."""
    import re

    from supertune.averaging.server_optimizers import SERVER_OPTIMIZERS
    from supertune.config.docs import config_keys
    from supertune.federation.config.schema import FederationConfig

    docs = {k.key: k.doc for k in config_keys(FederationConfig)}
    said = docs["aggregation.server_optimizer"]
    assert [n for n in SERVER_OPTIMIZERS if re.search(rf"\b{n}\b", said)] == list(SERVER_OPTIMIZERS), said

    def defaults(key: str) -> dict[str, float]:
        """`1 for fedavgm (...), 0.7 for nesterov, 0.01 for fedadam, fedyogi` -> {name: value}."""
        text = docs[key].split("empty: ", 1)[1].rstrip(".")
        found: dict[str, float] = {}
        for value, names in re.findall(r"(\d+(?:\.\d+)?) for (.+?)(?=, \d|$)", text):
            names = re.sub(r"\([^)]*\)", "", names)
            chosen = set(SERVER_OPTIMIZERS) - set(found) if names.strip() == "the others" else re.findall(r"\w+", names)
            found.update(dict.fromkeys(chosen, float(value)))
        return found

    assert defaults("aggregation.server_lr") == {n: o.lr for n, o in SERVER_OPTIMIZERS.items()}
    assert defaults("aggregation.server_momentum") == {n: o.momentum for n, o in SERVER_OPTIMIZERS.items()}
    for key in ("server_beta2", "server_tau"):
        users = docs[f"aggregation.{key}"].split(":", 1)[0]
        assert re.findall(r"\w+", users) == [n for n, o in SERVER_OPTIMIZERS.items() if key in o.uses], key
