"""Federated averaging (FedAvg) of models, adapters or checkpoints, streamed a slice of a tensor at a time.

    out = sum_i w_i * theta_i,   w_i = raw_i / sum_j raw_j   (raw: tokens seen, samples seen, 1, or given)

The order of work: resolve the inputs (inputs.py), check everything that needs no tensor values
(job.py, checks.py), then, in a staging directory beside the output (output.py), stream every
tensor a slice at a time (streamer.py) while other threads hash the inputs' files, copy the
config and tokenizer, check checkpoint inputs against their manifests' sha256, write the manifest
and rename the staging directory into place. A failure at any point leaves no output.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from ..checkpoints.faults import fault_point
from ..errors import UserError
from ..file_table import sha256_file, size_and_sha256
from ..output_dirs import Staging
from ..weight_files.dtypes import OUTPUT_DTYPES, OutputDtype
from ..weight_files.shard_writer import ShardWriter
from .checks import joined_problems
from .inputs import ADAPTER_CONFIG, GENERATION_CONFIG, MODEL_CONFIG, TOKENIZER_FILES, ModelInput, resolve_input
from .job import AverageJob, checked_job
from .manifest import AverageManifest, write_average_manifest
from .output import copy_side_files, write_index
from .server_step import MOMENTUM_FILE, SECOND_MOMENT_FILE, ServerStep, second_moment_file
from .streamer import TensorStreamer, WriterThread

__all__ = ["average_checkpoints", "DEFAULT_MAX_SHARD_BYTES"]

log = logging.getLogger("supertune")

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
"""5 GB per output shard, the Hugging Face default."""


def average_checkpoints(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    weights: str | Sequence[float] = "tokens",
    dtype: OutputDtype = "same",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    merge_base: str | Path | None = None,
    server: ServerStep | None = None,
    report: Callable[[str], None] | None = None,
    minimum_inputs: int = 2,
    delta_base: str | Path | None = None,
    rebase: bool = False,
) -> AverageManifest:
    """Average `inputs` (run directories, checkpoints, model or adapter directories) into `out_dir`.

    weights: "tokens" (default), "samples", "uniform" or one number per input. dtype: "same" keeps
    each tensor's dtype, else "bf16", "fp16" or "fp32". merge_base: LoRA adapter inputs are merged
    into this base model first and the merged models averaged. server: a FedAvgM step from a
    previous global model. minimum_inputs: 1 only for a federation's round with one site left. delta_base:
    the model transfer packages that hold a change were taken from; with rebase, the model their changes
    are added to, whichever they were taken from (a buffered federation's stale changes). Raises UserError, having written nothing, for every input that cannot
    be averaged; returns the manifest written into the output.
    """
    started = time.monotonic()
    say = report or log.info
    models = [resolve_input(x, delta_base, rebase) for x in inputs]
    job = None
    try:
        job = checked_job(
            models,
            Path(out_dir).expanduser().absolute(),
            weights,
            dtype,
            max_shard_bytes,
            merge_base,
            server,
            minimum_inputs,
        )
        for i, inp in enumerate(job.inputs):
            count = f", {inp.tokens:,} tokens" if inp.tokens is not None else ""
            say(
                f"{inp.label(i)}: {inp.described}, weight {job.weights.normalised[i]:.4f} ({job.weights.mode}{count}), {inp.directory}"
            )
        for note in job.notes:
            say(f"note: {note}")
        return _write(job, say, started)
    finally:
        for inp in models + ([job.merge.base] if job and job.merge else []):
            inp.weights.close()
        if job and job.server:
            job.server.close()


def _write(job: AverageJob, say: Callable[[str], None], started: float) -> AverageManifest:
    """Stream every tensor into the staging directory, add the side files and the manifest, publish."""
    momentum_target = (
        Path(job.server.step.momentum_out).absolute()
        if job.server and job.server.keeps_momentum and job.server.step.momentum_out
        else None
    )
    second_target = second_moment_file(momentum_target) if momentum_target else None
    # A --momentum-out elsewhere is staged beside it (a directory with the staging marker), like the output.
    state_staging = Staging(momentum_target, "--momentum-out") if momentum_target else nullcontext(None)
    with Staging(job.out, "--out") as staging, state_staging as beside:
        momentum_path, second_path = staging.path / MOMENTUM_FILE, staging.path / SECOND_MOMENT_FILE
        if beside is not None and momentum_target and second_target:
            momentum_path, second_path = beside.path / momentum_target.name, beside.path / second_target.name
        writers: list[ShardWriter] = []
        # sha256 runs at about 2 GB/s per core: the inputs are hashed by every core while the
        # main thread averages and the writer thread writes (and hashes) the output.
        hashing = ThreadPoolExecutor(_usable_cores(), thread_name_prefix="supertune-average-hash")
        try:
            paths = [p for m in job.hashed for p in m.files] + (job.server.state_in_paths if job.server else [])
            hashes = {p: hashing.submit(sha256_file, p) for p in sorted(set(paths), key=lambda p: -p.stat().st_size)}
            if job.server:
                job.server.open_writer(momentum_path, second_path, job.planned, job.averaged)
            try:
                files, weight_map = _stream(job, staging, writers, say)
            except UserError:
                # A file that could not be read is better named by its manifest, when it differs from it.
                _verified_hashes(job, hashes)
                raise
            state_records: dict[str, dict] = {}
            if job.server:
                for key, writer, name, target in (
                    ("momentum_out", job.server.writer, MOMENTUM_FILE, momentum_target),
                    ("second_moment_out", job.server.second_writer, SECOND_MOMENT_FILE, second_target),
                ):
                    if writer is None:
                        continue
                    digest = writer.finish()
                    if not target:
                        files[name] = digest
                    state_records[key] = {"path": str(target or job.out / name), **digest}
            if job.kind != "adapter":
                name = write_index(staging.path, weight_map, sum(t.nbytes for t in job.planned))
                files[name] = size_and_sha256(staging.path / name)
            side = [MODEL_CONFIG, GENERATION_CONFIG, *TOKENIZER_FILES] + (
                [ADAPTER_CONFIG] if job.kind == "adapter" else []
            )
            tokenizer_source = next(
                (m for m in job.inputs if any(f in m.side_files for f in TOKENIZER_FILES)), job.reference
            )
            for name in copy_side_files(
                tokenizer_source, staging.path, side, OUTPUT_DTYPES[job.dtype], config_source=job.reference
            ):
                files[name] = size_and_sha256(staging.path / name)
            manifest = _manifest(job, files, _verified_hashes(job, hashes), state_records)
            manifest.seconds = round(time.monotonic() - started, 3)
            write_average_manifest(staging.path, manifest)
            fault_point("average.written", 0, 0)
            staging.publish()
            if beside is not None and momentum_target and second_target:
                second = [second_target] if job.server and job.server.second_writer else []
                beside.publish_files([momentum_target, *second])
        except BaseException:
            hashing.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            hashing.shutdown(wait=True)
            for writer in writers:
                writer.abort()
    what = "adapter" if job.kind == "adapter" else "model"
    say(f"average of {len(job.inputs)} {what}{'s' if len(job.inputs) != 1 else ''} written to {job.out}")
    return manifest


def _stream(
    job: AverageJob, staging: Staging, writers: list[ShardWriter], say: Callable[[str], None]
) -> tuple[dict[str, dict], dict[str, str]]:
    """Every shard, tensor by tensor; ({shard: {size, sha256}}, {tensor: shard})."""
    files: dict[str, dict] = {}
    weight_map: dict[str, str] = {}
    index = 0
    with WriterThread() as pipe:
        streamer = TensorStreamer(job, pipe)
        for shard_name, shard in job.shards:
            writer = ShardWriter(staging.path / shard_name, shard)
            writers.append(writer)
            for t in shard:
                fault_point("average.tensor", index, 0)
                streamer.write_tensor(t, writer)
                weight_map[t.name] = shard_name
                index += 1
            files[shard_name] = pipe.finish(writer)
            say(f"wrote {shard_name} ({files[shard_name]['size'] / 1e9:.2f} GB)")
    return files, weight_map


def _usable_cores() -> int:
    """Cores this process may run on (a SLURM task's own, not the node's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else max(1, os.cpu_count() or 1)


def _verified_hashes(job: AverageJob, hashes: dict[Path, Future]) -> dict[Path, str]:
    """Every input file's sha256; a checkpoint or saved model whose files differ from its manifest is refused."""
    digests = {path: future.result() for path, future in hashes.items()}
    problems = []
    for i, inp in enumerate(job.inputs):
        recorded = inp.checkpoint.files if inp.checkpoint is not None else inp.model_files
        if recorded is None:
            continue
        kind = "checkpoint" if inp.checkpoint is not None else "model"
        for path in inp.files:
            name = path.relative_to(inp.directory).as_posix()  # fsdp_model/__0_0.distcp: manifests key by relative path
            expected = recorded.get(name)
            if expected is not None and expected["sha256"] != digests[path]:
                problems.append(
                    f"{inp.label(i)}: {name} does not match its {kind} manifest (sha256); the {kind} is damaged, average another one"
                )
    if problems:
        raise UserError(joined_problems(problems))
    return digests


def _manifest(job: AverageJob, files: dict, digests: dict[Path, str], state: dict[str, dict]) -> AverageManifest:
    def record(inp: ModelInput) -> dict:
        return {str(p.relative_to(inp.directory)): size_and_sha256(p, digests[p]) for p in inp.files}

    inputs = [
        {
            "arg": inp.arg,
            "directory": str(inp.directory),
            "described": inp.described,
            "weight": job.weights.normalised[i],
            "raw_weight": job.weights.raw[i],
            "tokens": inp.tokens,
            "tokens_source": inp.tokens_source,
            "samples": inp.samples,
            "samples_source": inp.samples_source,
            "files": record(inp),
        }
        for i, inp in enumerate(job.inputs)
    ]
    dtypes: dict[str, int] = {}
    for t in job.planned:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    tokens = [inp.tokens for inp in job.inputs]
    samples = [inp.samples for inp in job.inputs]
    server = None
    if job.server:
        s = job.server

        def read(path: Path | None) -> dict | None:
            return {"path": str(path), "sha256": digests[path]} if path else None

        server = {
            "optimizer": s.optimizer,
            "lr": s.lr,
            "momentum": s.momentum,
            "global_model": {"directory": str(s.global_model.directory), "files": record(s.global_model)},
            "momentum_in": read(s.momentum_in_path),
            "momentum_out": state.get("momentum_out"),
        }
        if s.moments == 2:
            server.update(
                beta2=s.step.beta2,
                tau=s.step.tau,
                second_moment_in=read(s.second_in_path),
                second_moment_out=state.get("second_moment_out"),
            )
    return AverageManifest(
        kind=job.kind,
        weights=job.weights.mode,
        dtype=job.dtype,
        inputs=inputs,
        tokens=sum(tokens) if None not in tokens else None,
        samples=sum(samples) if None not in samples else None,
        tensors=len(job.planned),
        parameters=sum(t.numel for t in job.planned),
        tensor_dtypes=dtypes,
        files=files,
        tokenizer_sha256=job.tokenizer,
        notes=job.notes,
        base={"directory": str(job.merge.base.directory), "files": record(job.merge.base)} if job.merge else None,
        server=server,
    )
