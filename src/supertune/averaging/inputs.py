"""What a MODEL argument of `supertune average` names: the directory holding its weights, and where
its count of tokens and samples seen comes from.

| argument | weights read from | tokens | samples |
| --- | --- | --- | --- |
| a checkpoint (`supertune-checkpoint.json`) | the checkpoint (an FSDP run's: its `fsdp_model/` shards) | its manifest's `tokens_seen` | its manifest's `samples_seen` |
| a finished run directory | its `model/` | the run's `summary.json` `train_tokens` | the manifest of the run's checkpoint at its final step |
| an unfinished run directory (no `model/`) | the checkpoint `checkpoints/latest` names | as for that checkpoint | as for that checkpoint |
| `<run dir>/model` | itself | as for its run | as for its run |
| the output of `supertune average` | itself | the sum over its inputs (`supertune-average.json`) | the same |
| any other model directory | itself | unknown | unknown |

Token-weighted averages of averages therefore equal the flat average over all the original inputs.
An FSDP run's checkpoint holds no safetensors: its shards are read through sharded_input.py, under
the names the run's saved model/ has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoints.layout import CheckpointDir
from ..checkpoints.manifest import (
    AVERAGE_MANIFEST,
    MANIFEST_FILE,
    MODEL_MANIFEST_FILE,
    CheckpointManifest,
    model_manifest_size_problems,
    read_manifest,
)
from ..distributed.fsdp_checkpoint import is_sharded_checkpoint
from ..errors import UserError
from ..rundir import RunDir, holds_run, run_of_model
from ..transfer.package import (
    PACKAGE_MANIFEST,
    PACKAGE_WEIGHTS,
    PackageWeights,
    package_problems,
    read_package,
    weights_digest,
)
from ..weight_files.tensor_files import INDEX_SUFFIX, WeightFiles
from .sharded_input import ShardedWeights

__all__ = [
    "ModelInput",
    "resolve_input",
    "ADAPTER_CONFIG",
    "AVERAGE_MANIFEST",
    "MODEL_CONFIG",
    "GENERATION_CONFIG",
    "TOKENIZER_FILES",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MODEL_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files that make up a saved tokenizer; the ones present are compared, hashed and copied."""


@dataclass
class ModelInput:
    """One model to average, resolved from what the user named."""

    arg: str
    """The argument as given."""
    directory: Path
    """Absolute path of the directory holding the weights."""
    described: str
    """What the argument was found to be, for messages: 'checkpoint', 'run directory (its model/)', ..."""
    weights: WeightFiles | ShardedWeights | PackageWeights
    """Safetensors files, or an FSDP checkpoint's shards read as the tensors of a saved model."""
    adapter: bool
    """LoRA adapters (adapter_model.safetensors + adapter_config.json) rather than a full model."""
    tokens: int | None
    tokens_source: str
    """Where `tokens` came from, or why it is unknown."""
    samples: int | None
    samples_source: str
    checkpoint: CheckpointManifest | None = None
    """The checkpoint manifest, when the weights are a checkpoint's (its hashes are checked)."""
    model_files: dict[str, dict[str, Any]] | None = None
    """A saved model's manifest (supertune-model.json: a run's model/): {file: {size, sha256}}, checked like a checkpoint's."""
    side_files: list[str] = field(default_factory=list)
    """Config, generation config, adapter config and tokenizer files present beside the weights."""

    def label(self, index: int) -> str:
        return f"input {index + 1} ({self.arg})"

    def json_file(self, name: str) -> dict[str, Any] | None:
        """A JSON file beside the weights (config.json, adapter_config.json), or None when absent."""
        path = self.directory / name
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"MODEL {self.arg}: {name} is unreadable ({exc})") from None
        if not isinstance(data, dict):
            raise UserError(f"MODEL {self.arg}: {name} is not a JSON object")
        return data

    @property
    def files(self) -> list[Path]:
        """Every file the average reads from this input: weights (and index), then the side files."""
        return self.weights.paths + [self.directory / name for name in self.side_files]


def resolve_input(arg: str | Path, delta_base: str | Path | None = None, rebase: bool = False) -> ModelInput:
    """What `arg` names (see the module's table); UserError with the way out when it holds no usable weights.
    `delta_base`: the model a transfer package's change was taken from (a federation's previous global model);
    with `rebase`, the model its change is added to whichever model it was taken from (a buffered
    federation applies a change from an older global version to the newest)."""
    text = str(arg)
    path = Path(text).expanduser().absolute()
    if not path.exists():
        raise UserError(f"MODEL {text}: no such file or directory")
    if not path.is_dir():
        raise UserError(
            f"MODEL {text}: is a file; give the directory that holds the weights (a run, a checkpoint or a saved model)"
        )
    if (path / PACKAGE_MANIFEST).is_file():
        return _package(text, path, delta_base, rebase)
    if (path / MANIFEST_FILE).is_file():
        return _checkpoint(text, path, "checkpoint")
    if holds_run(path):
        return _run(text, path)
    described, tokens, samples = _model_counts(path)
    return _make(text, path, described, tokens, samples)


def _package(text: str, path: Path, delta_base: str | Path | None, rebase: bool = False) -> ModelInput:
    """A site's result as it travelled (supertune.transfer): decoded a slice at a time, onto its base
    when it holds a change; its files' sizes now, their sha256 while the average reads them."""
    label = f"MODEL {text}"
    package = read_package(path, label)
    damaged = package_problems(package, hashes=False)
    if damaged:
        raise UserError(f"{label}: {damaged[0]}; the transfer package is damaged, send it again")
    base = None
    if package.delta:
        if delta_base is None:
            raise UserError(f"{label}: holds a change from a global model; give that model as the delta base")
        base = resolve_input(delta_base).weights
        if not rebase and cached_digest(base) != package.base:
            raise UserError(
                f"{label}: holds a change from another model than {delta_base} (the sha256 of its weights differ); "
                "it can only be added to the global model it was taken from"
            )
    adapter = ADAPTER_CONFIG in package.files
    counts = package.counts
    source = f"transfer package ({PACKAGE_MANIFEST})"
    tokens, samples = counts.get("tokens"), counts.get("samples")
    return ModelInput(
        arg=text,
        directory=path,
        described=f"transfer package ({package.codec.name}{', a change' if package.delta else ''})",
        weights=PackageWeights(package, base, label),
        adapter=adapter,
        tokens=tokens if isinstance(tokens, int) else None,
        tokens_source=source,
        samples=samples if isinstance(samples, int) else None,
        samples_source=source,
        side_files=[f for f in package.files if f != PACKAGE_WEIGHTS],
        model_files=package.files,
    )


_DIGESTS: dict[tuple, dict[str, str]] = {}


def cached_digest(weights) -> dict[str, str]:
    """weights_digest, once per file version in this process: the base of every site's change is the
    same global model, hashed once (about 1 s per GB) rather than once per site."""
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in weights.paths)
    if key not in _DIGESTS:
        _DIGESTS[key] = weights_digest(weights)
    return _DIGESTS[key]


def _run(text: str, path: Path) -> ModelInput:
    run = RunDir(path)
    model_weights = _weights_file(run.model) if run.model.is_dir() else None
    summary = run.read_summary(f"MODEL {run.path}") if model_weights else None
    if summary is not None:
        tokens, samples = _run_counts(run, summary)
        return _make(text, run.model, "run directory (its model/)", tokens, samples)
    if model_weights:
        raise UserError(
            f"MODEL {text}: the run has model/ but no summary.json (it stopped before finishing, so model/ may be incomplete); "
            f"give one of its checkpoints, e.g. {text.rstrip('/')}/checkpoints/<checkpoint-N>"
        )
    latest = CheckpointDir(run.checkpoints).latest()
    if latest is None or not (latest / MANIFEST_FILE).is_file():
        raise UserError(f"MODEL {text}: the run has neither a finished model/ nor a published checkpoint to average")
    return _checkpoint(text, latest, f"run directory (its latest checkpoint, {latest.name})")


def _checkpoint(text: str, path: Path, described: str) -> ModelInput:
    try:
        manifest = read_manifest(path)
    except ValueError as exc:
        raise UserError(f"MODEL {text}: {exc}; give a checkpoint whose save finished") from None
    where = "checkpoint manifest"
    inp = _make(
        text,
        path,
        described,
        (manifest.tokens_seen, f"{where} tokens_seen"),
        (manifest.samples_seen, f"{where} samples_seen"),
    )
    inp.checkpoint = manifest
    return inp


def _model_counts(path: Path) -> tuple[str, tuple[int | None, str], tuple[int | None, str]]:
    """(description, tokens, samples) of a model directory that is not a checkpoint or a run."""
    parent = run_of_model(path)
    if parent is not None:
        summary = parent.read_summary(f"MODEL {parent.path}")
        if summary is None:
            missing = (
                None,
                f"its run {path.parent} has no summary.json (unfinished); give a checkpoint of the run instead",
            )
            return "model directory of a run", missing, missing
        tokens, samples = _run_counts(parent, summary)
        return "model directory of a run", tokens, samples
    if (path / AVERAGE_MANIFEST).is_file():
        try:
            data = json.loads((path / AVERAGE_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"MODEL {path}: {AVERAGE_MANIFEST} is unreadable ({exc})") from None
        source = f"{AVERAGE_MANIFEST} (the sum over the models it averages)"
        unknown = f"{AVERAGE_MANIFEST}: not known for every model it averages"
        tokens, samples = data.get("tokens"), data.get("samples")
        return (
            "output of supertune average",
            (tokens, source) if isinstance(tokens, int) else (None, unknown),
            (samples, source) if isinstance(samples, int) else (None, unknown),
        )
    bare = (None, "a model directory with no checkpoint manifest and no run summary beside it")
    return "model directory", bare, bare


def _run_counts(run: RunDir, summary: dict[str, Any]) -> tuple[tuple[int | None, str], tuple[int | None, str]]:
    """Tokens from the run's summary.json; samples from its checkpoint at the final step (the summary has none)."""
    tokens_value = summary.get("train_tokens")
    tokens = (
        (int(tokens_value), "run summary.json train_tokens")
        if isinstance(tokens_value, int)
        else (None, "run summary.json has no train_tokens")
    )
    step = summary.get("train_steps")
    final = CheckpointDir(run.checkpoints).final(int(step)) if isinstance(step, int) else None
    if final is not None and (final / MANIFEST_FILE).is_file():
        try:
            samples = (
                read_manifest(final).samples_seen,
                f"manifest of {final.name} (the run's final step) samples_seen",
            )
        except ValueError as exc:
            samples = (None, f"{final.name}: {exc}")
    else:
        samples = (None, f"the run keeps no checkpoint of its final step {step}; give that run's checkpoint instead")
    return tokens, samples


def _weights_file(directory: Path) -> str | None:
    """The file to read weights from, in the order Hugging Face loaders look: adapters, one file, an index."""
    if (directory / ADAPTER_CONFIG).is_file() and (directory / ADAPTER_WEIGHTS).is_file():
        return ADAPTER_WEIGHTS
    for name in ("model.safetensors", "model" + INDEX_SUFFIX):
        if (directory / name).is_file():
            return name
    indexes = sorted(p.name for p in directory.glob("*" + INDEX_SUFFIX))
    return indexes[0] if len(indexes) == 1 else None


def _make(
    text: str, directory: Path, described: str, tokens: tuple[int | None, str], samples: tuple[int | None, str]
) -> ModelInput:
    name = _weights_file(directory)
    sharded = name is None and is_sharded_checkpoint(directory)
    if name is None and not sharded:
        others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".safetensors"))
        hint = (
            f"it holds {', '.join(others[:3])}; only safetensors weights are averaged (save them again with save_pretrained)"
            if others
            else "it holds no model.safetensors, index or adapter_model.safetensors"
        )
        raise UserError(f"MODEL {text}: no weights to average in {directory} ({hint})")
    adapter = name == ADAPTER_WEIGHTS
    side = [MODEL_CONFIG, GENERATION_CONFIG, *TOKENIZER_FILES] + ([ADAPTER_CONFIG] if adapter else [])
    # Sizes against the manifest now (a stat per file); the sha256 is compared while the average reads every file.
    damaged = model_manifest_size_problems(directory)
    if damaged:
        what = "checkpoint" if (directory / MANIFEST_FILE).is_file() else "model"
        raise UserError(f"MODEL {text}: {damaged[0]}; the {what} is damaged, average another one")
    return ModelInput(
        arg=text,
        directory=directory,
        described=described + (" (FSDP shards)" if sharded else ""),
        weights=ShardedWeights(directory, f"MODEL {text}") if sharded else WeightFiles(directory, name),
        adapter=adapter,
        tokens=tokens[0],
        tokens_source=tokens[1],
        samples=samples[0],
        samples_source=samples[1],
        side_files=[f for f in side if (directory / f).is_file()],
        model_files=_model_manifest(directory),
    )


def _model_manifest(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The file table of a saved model's manifest (checked readable by model_manifest_size_problems), or None."""
    path = directory / MODEL_MANIFEST_FILE
    if not path.is_file():
        return None
    files = json.loads(path.read_text(encoding="utf-8"))["files"]
    return {str(k): v for k, v in files.items()}
