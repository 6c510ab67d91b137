"""The one place where a new run's config is resolved, once, when the run is created:

    defaults < cluster profile's run_config < base (a saved run's settings) < YAML file < command line

The profile is a site's default that the user's file and command line can change; what a site
cannot do (bf16 on V100s) is refused by `checks.site_problems` instead of being overridden behind
the user's back. The result is written into the run directory as config.yaml, with
`resolution.json` saying which layers and which profile files (with sha256) made it; from then on
every process reads that config.yaml as it is (`load_run_dir_config`), whatever launch.cluster says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..clusters import ProfileError, load_profile_with_sources
from ..clusters.schema import ClusterProfile
from ..config.build import build_config, build_config_and_problems
from ..config.errors import ConfigError
from ..config.load import absolute_paths
from ..config.overrides import OverrideValue, parse_overrides
from ..config.schema import RunConfig
from ..config.validate import config_problems
from ..config.yaml_file import read_config_file
from ..errors import UserError
from .checks import bundle_problems, deep_problems, model_file_problems, site_problems
from .global_batch import planned_world_size, with_global_batch
from .layers import Layer, merge_layers, origins
from .model_fit import model_fit_problems

__all__ = ["Resolution", "resolve", "resolve_run_config", "load_run_dir_config", "COMMAND_LINE"]

COMMAND_LINE = "command line"


@dataclass(frozen=True)
class Resolution:
    """A resolved run config and how it came to be."""

    config: RunConfig
    layers: tuple[Layer, ...]
    """Lowest first; the defaults are below all of them."""
    profile: ClusterProfile | None
    overrides: tuple[str, ...]

    def origins(self) -> dict[str, str]:
        """Dotted key -> the layer that set it (keys at their default are left out)."""
        return origins(list(self.layers))


def resolve(
    path: str | os.PathLike[str] | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    base_name: str = "base",
    files_here: bool = True,
    trains: bool = True,
) -> Resolution:
    """Resolve a new run's config from its layers; one ConfigError lists every problem found.

    files_here=False: the run's files (data, models, a DeepSpeed file) are on another machine (a
    federated site reached over SSH): only types, keys and the profile are checked here, and paths
    are left as written; the site resolves the config again, with every check, where the files are.

    trains=False: nothing trains with this config here (`supertune prepare` tokenizes its data):
    the sharding strategy's checks, which are about training processes, are left out.
    """
    user_layers = []
    if base:
        user_layers.append(Layer(base_name, base))
    if path:
        user_layers.append(Layer(str(path), read_config_file(path), (os.path.abspath(path),)))
    cli = parse_overrides(overrides) if overrides else {}
    if cli:
        user_layers.append(Layer(COMMAND_LINE, cli))
    problems: list[str] = []
    profile, profile_layer = _profile_layer(_cluster_name(merge_layers(user_layers)), problems)
    layers = ([profile_layer] if profile_layer else []) + user_layers
    layers += _epochs_layer(layers)
    # An unknown key or a wrong type leaves its field at the default: the rest is checked as well,
    # so the user sees every problem of the config in one error.
    cfg, build_problems = build_config_and_problems(RunConfig, merge_layers(layers))
    pairs = _embedded_pairs_layer(cfg, layers)
    if pairs:  # built again with the rule's values, each where no layer set it
        layers += pairs
        cfg, build_problems = build_config_and_problems(RunConfig, merge_layers(layers))
    problems += build_problems
    cfg = _planned_global_batch(cfg, profile, problems)
    if not files_here:
        if problems:
            raise ConfigError(problems)
        return Resolution(cfg, tuple(layers), profile, tuple(overrides or ()))
    _check(cfg, profile, problems, trains)
    return Resolution(absolute_paths(cfg), tuple(layers), profile, tuple(overrides or ()))


EPOCHS_RULE = "training.num_train_epochs given without training.max_steps"
"""The layer that sets training.max_steps to -1 when only the epochs were given (its name in --origin)."""


def _epochs_layer(layers: list[Layer]) -> list[Layer]:
    """training.max_steps=-1 when a layer sets training.num_train_epochs and none sets max_steps.

    max_steps has a default (120, a short first run) and the Trainer lets max_steps win over epochs,
    so an epochs value written alone would be ignored without a word. Written alone it wins; written
    with max_steps, max_steps wins, as in the Trainer (docs/config.md says so)."""
    found = origins(layers)
    if "training.num_train_epochs" in found and "training.max_steps" not in found:
        return [Layer(EPOCHS_RULE, {"training": {"max_steps": -1}})]
    return []


EMBEDDED_PAIRS_RULE = "a preference objective on the embedded pairs (no data given)"
"""The layer that sets the steps and learning rate the embedded preference pairs need (its name in --origin)."""
EMBEDDED_PAIRS_SETTINGS = {"max_steps": 400, "learning_rate": 3e-3}
"""DPO from fresh weights on the embedded pairs learns to copy a word of the prompt late and then at
once: held-out preference accuracy 0.68 at step 100, 0.89 at 200, 0.955 at 300 and at 400 with these
(0.81 after 250 steps: the schedule decays sooner); the default 120 steps at 2e-3 stay near chance."""


def _embedded_pairs_layer(cfg: RunConfig, layers: list[Layer]) -> list[Layer]:
    """training.max_steps and learning_rate of EMBEDDED_PAIRS_SETTINGS, where no layer sets them, for a
    preference objective with no data given (the embedded pairs stand in, as the corpus does for sft)."""
    if cfg.training.objective == "sft" or not cfg.data.embedded:
        return []
    found = origins(layers)
    unset = {k: v for k, v in EMBEDDED_PAIRS_SETTINGS.items() if f"training.{k}" not in found}
    return [Layer(EMBEDDED_PAIRS_RULE, {"training": unset})] if unset else []


def resolve_run_config(
    path: str | os.PathLike[str] | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    trains: bool = True,
) -> RunConfig:
    """The resolved config alone (see `resolve`)."""
    return resolve(path, overrides, base, trains=trains).config


def load_run_dir_config(path: str | os.PathLike[str]) -> RunConfig:
    """A run directory's config.yaml as it was resolved (no layer applied again), checked again here,
    in the process that trains: its files and its DeepSpeed may differ from the submitting machine's."""
    cfg = build_config(RunConfig, read_config_file(path))
    _check(cfg, None, [])
    return absolute_paths(cfg)


def _check(cfg: RunConfig, profile: ClusterProfile | None, problems: list[str], trains: bool = True) -> None:
    """Every check, all problems in one ConfigError: the config's own, its model files' and whether the
    data fits the model, the site's, then (for a config sound so far, since they may import
    transformers or DeepSpeed) the model's and the strategy's."""
    own = config_problems(cfg) + model_file_problems(cfg)
    own += model_fit_problems(cfg) if not own else []  # reads the model's config.json: only for a config sound so far
    problems += own + site_problems(cfg, profile) + bundle_problems(cfg)
    if not problems:
        problems += deep_problems(cfg, strategy=trains)
    if problems:
        raise ConfigError(problems)


def _planned_global_batch(cfg: RunConfig, profile: ClusterProfile | None, problems: list[str]) -> RunConfig:
    """training.global_batch_size split for the processes the config plans (written into config.yaml;
    each training process checks it against its own world size)."""
    from ..config.ranges import within_range

    t = cfg.training
    if t.global_batch_size is None or t.global_batch_size <= 0 or t.per_device_train_batch_size <= 0:
        return cfg  # nothing to split, or a value config_problems reports
    if not (
        within_range("training.global_batch_size", t.global_batch_size)
        and within_range("training.per_device_train_batch_size", t.per_device_train_batch_size)
    ):
        return cfg  # past its bound: reported by config_problems (and the split would search that far)
    try:
        return with_global_batch(cfg, max(1, planned_world_size(cfg, profile)))
    except ConfigError as exc:
        problems += exc.problems
        return cfg


def _cluster_name(data: dict[str, Any]) -> str:
    launch = data.get("launch")
    name = launch.get("cluster", "local") if isinstance(launch, dict) else "local"
    if isinstance(name, OverrideValue):
        name = name.raw
    return name if isinstance(name, str) else "local"  # a wrong type is reported by the build


def _profile_layer(name: str, problems: list[str]) -> tuple[ClusterProfile | None, Layer | None]:
    """The profile named by launch.cluster and its run_config as a layer; problems are collected."""
    try:
        profile, sources = load_profile_with_sources(name)
    except ProfileError as exc:
        problems += exc.problems
        return None, None
    except UserError as exc:  # an unknown name, with the known ones and a close match
        problems.append(str(exc))
        return None, None
    files = tuple(str(f) for f in (sources.shipped, sources.user) if f is not None)
    return profile, Layer(f"profile {name}", profile.run_config, files)
