"""A base model saved without its tokenizer and `model.tokenizer: DIR` beside it (the two-site Llama
recipe's layout): `supertune eval` and `supertune federate` use that tokenizer, and the global
models carry it forward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supertune.cli.main import main
from supertune.federation.config.default import site_corpus


@pytest.fixture(scope="module")
def base_and_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from supertune.config.schema import ModelConfig, RunConfig
    from supertune.modeling.model import build_model
    from supertune.modeling.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("separate-tokenizer")
    tokenizer = load_tokenizer(RunConfig())
    model = build_model(ModelConfig(config_overrides={"num_hidden_layers": 1}), tokenizer)
    model.save_pretrained(root / "base")  # weights and config only, as a converted checkpoint often is
    tokenizer.save_pretrained(root / "tokenizer")
    assert not list((root / "base").glob("tokenizer*"))
    return root / "base", root / "tokenizer"


def test_eval_uses_model_tokenizer(base_and_tokenizer: tuple[Path, Path], capsys) -> None:
    base, tokenizer = base_and_tokenizer
    _, validation = site_corpus("site-a")
    assert main(["eval", str(base), "--data", str(validation)]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err  # without it: refused, naming what is missing
    assert main(["eval", str(base), "--data", str(validation), f"model.tokenizer={tokenizer}"]) == 0
    assert capsys.readouterr().out.startswith("eval loss ")


@pytest.mark.slow
def test_a_federation_from_a_base_without_tokenizer_files(
    base_and_tokenizer: tuple[Path, Path], tmp_path: Path
) -> None:
    base, tokenizer = base_and_tokenizer
    sites = []
    for name in ("site-a", "site-b"):
        train, validation = site_corpus(name)
        overrides = [f"data.train_files={train}", f"data.validation_files={validation}", f"model.tokenizer={tokenizer}"]
        overrides += [
            "generate.max_new_tokens=0",
            "training.report_to=[]",
            "data.max_eval_samples=8",
            "training.warmup_steps=0",
        ]
        sites.append({"name": name, "overrides": overrides, "steps_per_round": 2})
    config = {"name": "fed-tok", "base_model": str(base), "rounds": 1, "sites": sites}
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "federate", str(tmp_path / "federation.yaml"), "--dir", str(tmp_path / "fed")],
        capture_output=True, text=True, env=dict(os.environ), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = tmp_path / "fed" / "round-001" / "global"
    assert (final / "tokenizer.json").read_bytes() == (tokenizer / "tokenizer.json").read_bytes()
    assert main(["eval", str(final), "--data", str(site_corpus("site-b")[1])]) == 0  # its own tokenizer now
