"""Find cluster profiles: those shipped with supertune, and the user's own merged over them.

A profile is one YAML file named after it (`lumi.yaml` is the profile `lumi`). Shipped files live in
`clusters/profiles/`; a user file of the same name in `user_profile_dir()` is deep-merged over the
shipped one, so changing only `account:` keeps everything else, and a user file of a new name adds a
profile. Every file is type-checked on its own first, so a bad key is reported against the file
it is in. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..config.errors import ConfigError
from ..errors import UserError
from .schema import ClusterProfile
from .validate import profile_problems

__all__ = [
    "ProfileError",
    "ProfileSources",
    "list_profiles",
    "load_profile",
    "load_profile_with_sources",
    "profile_names",
    "profile_sources",
    "shipped_profile_dir",
    "user_profile_dir",
]

SUFFIXES = (".yaml", ".yml")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class ProfileError(ConfigError):
    """Every problem found in cluster profile files, one line each, each naming its file."""

    def _render(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0]
        return "\n".join([f"{len(self.problems)} problems in cluster profiles:"] + [f"  - {p}" for p in self.problems])


@dataclass(frozen=True)
class ProfileSources:
    """The files a profile is made of: the shipped one, the user's, or both (user over shipped)."""

    name: str
    shipped: Path | None = None
    user: Path | None = None

    def describe(self) -> str:
        if self.shipped and self.user:
            return f"shipped {self.shipped}, overridden by user file {self.user}"
        if self.user:
            return f"user file {self.user}"
        return f"shipped {self.shipped}"


def user_profile_dir() -> Path:
    """$SUPERTUNE_CONFIG_DIR/clusters, else $XDG_CONFIG_HOME/supertune/clusters, else ~/.config/supertune/clusters."""
    explicit = os.environ.get("SUPERTUNE_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser() / "clusters"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "supertune" / "clusters"


def shipped_profile_dir() -> Path:
    """The directory of the profiles shipped inside the package."""
    return Path(str(resources.files(__package__).joinpath("profiles")))


def profile_sources() -> dict[str, ProfileSources]:
    """Every known profile name and its files, sorted by name; raises ProfileError on ambiguous file names."""
    problems: list[str] = []
    shipped = _profile_files(shipped_profile_dir(), problems)
    user = _profile_files(user_profile_dir(), problems)
    if problems:
        raise ProfileError(problems)
    names = sorted(set(shipped) | set(user))
    return {n: ProfileSources(n, shipped.get(n), user.get(n)) for n in names}


def profile_names() -> list[str]:
    """Names of every known profile, sorted."""
    return list(profile_sources())


def list_profiles() -> list[ClusterProfile]:
    """Every profile, merged and checked, sorted by name; every problem of every file in one ProfileError."""
    problems: list[str] = []
    profiles = []
    for sources in profile_sources().values():
        try:
            profiles.append(_load(sources))
        except ProfileError as exc:
            problems += exc.problems
    if problems:
        raise ProfileError(problems)
    return profiles


def load_profile(name: str, *, what: str = "launch.cluster") -> ClusterProfile:
    """The profile `name`, merged and checked. `what` names the setting in the unknown-name error."""
    known = profile_sources()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(
            f"{what}: unknown cluster {name!r}{hint}; known: {', '.join(known)} "
            f"(add your own as {user_profile_dir() / (name + '.yaml')})"
        )
    return _load(known[name])


def load_profile_with_sources(name: str, *, what: str = "launch.cluster") -> tuple[ClusterProfile, ProfileSources]:
    """The profile `name` and the files it came from."""
    profile = load_profile(name, what=what)
    return profile, profile_sources()[name]


def _profile_files(directory: Path, problems: list[str]) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    found: dict[str, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix not in SUFFIXES or path.name.startswith(".") or not path.is_file():
            continue
        name = path.stem
        if not _NAME.match(name):
            problems.append(
                f"cluster profile {str(path)!r}: the file name must be the profile name (letters, digits, _ . -), e.g. mysite.yaml"
            )
        elif name in found:
            problems.append(
                f"cluster profile {name}: both {found[name].name} and {path.name} exist in {directory}; keep one"
            )
        else:
            found[name] = path
    return found


def _load(sources: ProfileSources) -> ClusterProfile:
    from ..config.build import build_config
    from ..config.overrides import deep_merge

    layers = [(p, _read(p)) for p in (sources.shipped, sources.user) if p is not None]
    problems: list[str] = []
    for path, data in layers:
        # Each file alone first: a wrong key or type is then reported against the file it is in.
        given = data.get("name", sources.name)
        if given != sources.name:
            problems.append(
                f"cluster profile {str(path)!r}: name: {given!r} differs from the file name; a profile is named by its file ({sources.name}{path.suffix})"
            )
        try:
            build_config(ClusterProfile, data)
        except ConfigError as exc:
            problems += [f"cluster profile {str(path)!r}: {p}" for p in exc.problems]
    if problems:
        raise ProfileError(problems)
    merged: dict[str, Any] = {}
    for _, data in layers:
        merged = deep_merge(merged, data)
    merged["name"] = sources.name
    if sources.user and sources.shipped and isinstance(merged.get("placeholder_keys"), list):
        # A key the user's file sets is the user's value (the shipped one, written again, is confirmed).
        user_data = layers[-1][1]
        merged["placeholder_keys"] = [k for k in merged["placeholder_keys"] if k not in user_data]
    if isinstance(merged.get("env"), dict):
        # A null in the user file removes a shipped variable instead of setting it to "None".
        # YAML reads OMP_NUM_THREADS: 7 as a number; the environment holds text.
        merged["env"] = {k: _env_text(v) for k, v in merged["env"].items() if v is not None}
    try:
        profile = build_config(ClusterProfile, merged)
    except ConfigError as exc:
        raise ProfileError(
            [f"cluster profile {sources.name} ({sources.describe()}): {p}" for p in exc.problems]
        ) from None
    user_keys = set(layers[-1][1]) if sources.user else set()
    found = profile_problems(profile)
    if found:
        raise ProfileError(
            [f"cluster profile {str(_origin(key, sources, user_keys))!r}: {text}" for key, text in found]
        )
    return profile


def _env_text(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _origin(key: str, sources: ProfileSources, user_keys: set[str]) -> Path:
    """The file a problem's top-level key came from: the user file when it sets that key."""
    top = key.split(".")[0].split("[")[0]
    if sources.user and (top in user_keys or sources.shipped is None):
        return sources.user
    assert sources.shipped is not None
    return sources.shipped


def _read(path: Path) -> dict[str, Any]:
    from ..config.yaml_file import read_yaml_mapping

    try:
        return read_yaml_mapping(path, "cluster profile", "keys (gpus_per_node:, env:, ...)")
    except ConfigError as exc:
        raise ProfileError(exc.problems) from None
