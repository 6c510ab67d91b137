"""The code is written to the formatter and linter settings in pyproject.toml ([tool.ruff]): the
suite runs ruff's format check and its lint check over src, tests and bench, so that a long line, an
unsorted import or an unused name is a decision written down there, not an accident."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREES = ("src", "tests", "bench")


def _ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [("format", "--check"), ("check",)], ids=["format", "check"])
def test_the_code_is_written_to_the_ruff_settings(command):
    result = _ruff(*command, "--no-cache", *TREES)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} (pyproject.toml [tool.ruff]):\n{result.stdout}{result.stderr}"
    )


def test_the_checks_can_fail(tmp_path):
    """The same settings refuse an unsorted import, an unused name and an unformatted line."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\nx=1\n")
    assert "F401" in _ruff("check", "--no-cache", str(bad), cwd=tmp_path).stdout
    assert _ruff("format", "--check", "--no-cache", str(bad), cwd=tmp_path).returncode == 1
