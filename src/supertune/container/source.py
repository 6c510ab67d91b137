"""How an image gets supertune itself: from this source checkout, or from a package index."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import UserError

__all__ = ["SupertuneSource", "resolve_source", "checkout_root"]

# What a source checkout must contain for pip to build supertune from it (README.md is the readme
# named in pyproject.toml, and setuptools refuses to build without it).
CHECKOUT_PARTS = ("pyproject.toml", "README.md", "src")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~+@:/#]*$")


@dataclass(frozen=True)
class SupertuneSource:
    """Either a checkout directory (copied into the image) or a pip requirement."""

    checkout: Path | None = None
    requirement: str | None = None

    def describe(self) -> str:
        return f"source checkout {self.checkout}" if self.checkout else self.requirement or ""


def checkout_root() -> Path | None:
    """The source checkout this supertune runs from (src layout), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[3]
    pyproject = root / "pyproject.toml"
    if all((root / part).exists() for part in CHECKOUT_PARTS) and pyproject.is_file():
        if re.search(r'^name\s*=\s*"supertune"', pyproject.read_text(encoding="utf-8"), re.MULTILINE):
            return root
    return None


def resolve_source(spec: str | None) -> SupertuneSource:
    """`spec`: a checkout directory or a pip requirement; None: this checkout, else supertune==VERSION."""
    if spec is None:
        root = checkout_root()
        return _from_checkout(root) if root else SupertuneSource(requirement=f"supertune=={__version__}")
    path = Path(spec).expanduser()
    if path.is_dir():
        missing = [part for part in CHECKOUT_PARTS if not (path / part).exists()]
        if missing:
            raise UserError(f"--supertune: {spec} is not a supertune source checkout (no {', '.join(missing)})")
        return _from_checkout(path.resolve())
    if not _REQUIREMENT.match(spec):
        raise UserError(
            f"--supertune: {spec!r} is neither a directory nor a pip requirement (e.g. supertune=={__version__} or a git+https URL)"
        )
    return SupertuneSource(requirement=spec)


def _from_checkout(root: Path) -> SupertuneSource:
    if re.search(r"\s", str(root)):
        # Apptainer's %files separates source and destination by whitespace.
        raise UserError(
            f"--supertune: the checkout path {str(root)!r} contains whitespace, which an Apptainer definition "
            f"cannot copy from; move it, or give a requirement such as --supertune supertune=={__version__}"
        )
    return SupertuneSource(checkout=root)
