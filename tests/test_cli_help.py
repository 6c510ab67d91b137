"""Every --help answers, shows an example, and imports neither torch nor transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from supertune.cli.main import COMMANDS

PROBE = """
import contextlib, io, json, sys
from supertune.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
        code = 0
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in ("torch", "transformers", "datasets", "peft", "numpy") if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy, "help": out.getvalue()}}))
"""


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in COMMANDS], ids=lambda a: " ".join(a))
def test_help_is_light_and_has_an_example(argv):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    assert result["heavy"] == [], f"--help imported {result['heavy']}"
    assert "example" in result["help"]
    assert "supertune " in result["help"]


def test_train_help_documents_every_config_key():
    from supertune.config.docs import config_keys

    proc = subprocess.run(
        [sys.executable, "-m", "supertune", "train", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    keys = config_keys()
    assert len(keys) > 60
    for key in keys:
        assert f"  {key.key} (" in proc.stdout
        assert key.doc, f"{key.key} has no docstring in the schema"


def test_config_keys_command_lists_keys(capsys):
    from supertune.cli.main import main

    assert main(["config", "keys"]) == 0
    out = capsys.readouterr().out
    assert "training.learning_rate (float; default 0.002)" in out
    assert "data.template" in out


def test_the_config_reference_in_the_docs_is_the_generated_one(capsys):
    """docs/config.md is `supertune config keys --markdown`: a key added or changed in the schema
    without regenerating it is caught here, not by a reader."""
    from pathlib import Path

    from supertune.cli.main import main

    assert main(["config", "keys", "--markdown"]) == 0
    reference = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    assert capsys.readouterr().out == reference.read_text(encoding="utf-8"), (
        "docs/config.md is out of date: run `supertune config keys --markdown > docs/config.md`"
    )
