"""The executors' table (federation/config/executors.py): every record starts an executor that runs a
round's work, the config offers exactly the records' names and refuses another in one line, and what
a record refuses or checks is what a federation with that executor is told."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

from supertune.config.errors import ConfigError
from supertune.federation.config.executors import EXECUTORS
from supertune.federation.config.load import federation_keys_set, load_federation
from supertune.federation.config.schema import FederationConfig


def _problems(tmp_path: Path, **config) -> list[str]:
    path = tmp_path / "federation.yaml"
    path.write_text(json.dumps({"rounds": 1, "sites": [{"name": "a"}, {"name": "b"}], **config}), encoding="utf-8")
    try:
        load_federation(path)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_every_record_names_a_factory_of_an_executor(name: str) -> None:
    module, _, attribute = EXECUTORS[name].factory.partition(":")
    factory = getattr(importlib.import_module(module), attribute)
    assert list(inspect.signature(factory).parameters)[:2] == ["fed", "root"]
    # a class, or a function whose return annotation names the class
    made = factory if inspect.isclass(factory) else inspect.signature(factory).return_annotation
    executor = getattr(importlib.import_module(module), made) if isinstance(made, str) else made
    assert callable(getattr(executor, "run_round", None)), f"{name}: {EXECUTORS[name].factory} makes no run_round"


def test_the_config_takes_the_records_names_and_no_other(tmp_path: Path) -> None:
    names = list(EXECUTORS)
    assert names[0] == FederationConfig().executor == "builtin"
    (line,) = _problems(tmp_path, executor="slurm")
    assert line.startswith(f"executor: 'slurm' is not one of {', '.join(names)}")


def test_what_a_record_refuses_is_refused_in_one_line(tmp_path: Path) -> None:
    settings = {
        "aggregation.min_sites": {"aggregation": {"min_sites": 2}},
        "site_retries": {"site_retries": 1},
        "round_deadline": {"round_deadline": "1h"},
        "transfer": {"transfer": {"delta": True}},
        "benchmarks": {"benchmarks": ["supertune_corpus"]},
    }
    assert set(settings) == set(federation_keys_set(FederationConfig()))
    refused = [(e, key) for e in EXECUTORS.values() for key in e.refuses]
    assert ("streamflow", "transfer") in [(e.name, key) for e, key in refused]
    for executor, key in refused:
        extra = {"exchange": str(tmp_path / "x")} if executor.uses_exchange else {}
        said = _problems(tmp_path, executor=executor.name, **settings[key], **extra)
        assert said == [
            f"{key}: not supported with executor: {executor.name} yet; leave it out, or use executor: builtin"
        ]
    # the same settings pass with an executor that carries them out
    assert _problems(tmp_path, **settings["transfer"]) == []


def test_a_site_key_of_one_executor_is_refused_with_another(tmp_path: Path) -> None:
    (streamflow,) = [e for e in EXECUTORS.values() if "login" in e.site_keys]
    said = _problems(tmp_path, sites=[{"name": "a", "login": "me@host"}, {"name": "b"}])
    assert said == [
        f"sites[0] (a).login: only used with executor: {streamflow.name}; remove it or set executor: {streamflow.name}"
    ]
