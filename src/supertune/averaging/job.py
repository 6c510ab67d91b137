"""An average that passed every check: its inputs and weights, the tensors to write and how they are
sharded. Everything here is decided from headers, configs and manifests, before anything is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..output_dirs import check_output_file
from ..weight_files.dtypes import AVERAGED, OUTPUT_DTYPES
from ..weight_files.shard_writer import PlannedTensor, plan_shards, shard_file_names
from .checks import check_inputs, check_output_path, joined_problems, tokenizer_sha256
from .inputs import ModelInput, resolve_input
from .lora_merge import MergePlan, merge_plan
from .output import free_bytes
from .server_step import ServerState, ServerStep, holds_server_state, second_moment_file
from .weights import InputWeights, input_weights

__all__ = ["AverageJob", "checked_job"]


@dataclass
class AverageJob:
    """An average that passed every check: what to read, what to write, and where."""

    inputs: list[ModelInput]
    weights: InputWeights
    out: Path
    dtype: str
    kind: str
    shards: list[tuple[str, list[PlannedTensor]]]
    averaged: set[str]
    """Names of the tensors that are averaged (floating point); the others are copied."""
    notes: list[str]
    tokenizer: str | None
    merge: MergePlan | None = None
    server: ServerState | None = None
    hashed: list[ModelInput] = field(default_factory=list)
    """Every model read (inputs, base, global model), whose files are hashed for the manifest."""

    @property
    def reference(self) -> ModelInput:
        """The model whose tensors the output has: the base when merging, else the first input."""
        return self.merge.base if self.merge else self.inputs[0]

    @property
    def planned(self) -> list[PlannedTensor]:
        return [t for _, shard in self.shards for t in shard]


def checked_job(
    models: list[ModelInput],
    out: Path,
    weights: str | Sequence[float],
    dtype: str,
    max_shard_bytes: int,
    merge_base: str | Path | None,
    server: ServerStep | None,
    minimum_inputs: int = 2,
) -> AverageJob:
    """Every check that needs no tensor values; UserError listing the problems, before anything is written."""
    if dtype not in OUTPUT_DTYPES:
        raise UserError(f"--dtype: {dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")
    if max_shard_bytes < 1:
        raise UserError(f"--max-shard-size: {max_shard_bytes} bytes; give a positive size such as 5GB")
    if server is not None and server.problems():
        raise UserError(joined_problems(server.problems()))
    base = resolve_input(merge_base) if merge_base is not None else None
    state = ServerState(server) if server is not None else None
    others = [("--base", base.directory)] if base else []
    if state:
        others.append(("--global-model", state.global_model.directory))
        others += [("--momentum-in", path) for path in state.state_in_paths]
    notes, tokenizer = check_inputs(models, out, others, minimum_inputs)
    problems = []
    if server and server.momentum_out is not None:
        # the state may replace the files it was read from (kept next to the federation's state)
        readonly = [o for o in others if o[0] != "--momentum-in"]
        targets = [Path(server.momentum_out)] + (
            [second_moment_file(server.momentum_out)] if state and state.moments == 2 else []
        )
        for target in targets:
            found = check_output_path(target, models, readonly, flag="--momentum-out", new_directory=False)
            if not found:
                try:  # a file of the user's, a directory, a link: refused; supertune's own state is replaced
                    check_output_file(target, "--momentum-out", "server optimizer state", own=holds_server_state)
                except UserError as exc:
                    found = [str(exc)]
            problems += found
    merge = None
    if base is not None:
        merge, merge_problems = merge_plan(base, models) if models[0].adapter else (None, [_NOT_ADAPTERS])
        problems += merge_problems
        base_tokenizer = tokenizer_sha256(base)
        if merge and tokenizer and base_tokenizer and base_tokenizer != tokenizer:
            notes.append("--base has a different tokenizer from the adapters; the output gets the adapters'")
    weights_used = input_weights(models, weights)
    if problems:
        raise UserError(joined_problems(problems))
    kind = "merged" if merge else "adapter" if models[0].adapter else "model"
    shards, averaged = _plan(base if merge else models[0], OUTPUT_DTYPES[dtype], kind, max_shard_bytes)
    job = AverageJob(models, weights_used, out, dtype, kind, shards, averaged, notes, tokenizer, merge, state)
    job.hashed = models + ([base] if base else []) + ([state.global_model] if state else [])
    problems = (state.problems(job.planned, averaged) if state else []) + _checkpoint_sizes(models) + _space(job)
    if problems:
        raise UserError(joined_problems(problems))
    return job


_NOT_ADAPTERS = "--merge-first: the inputs are full models, not LoRA adapters; leave out --merge-first and --base"


def _plan(
    reference: ModelInput, out_dtype: str | None, kind: str, max_shard_bytes: int
) -> tuple[list[tuple[str, list[PlannedTensor]]], set[str]]:
    """The output's shards (file name, tensors) and the names of the tensors that are averaged."""
    planned, averaged = [], set()
    for name in reference.weights.in_file_order():
        entry = reference.weights.entry(name)
        if entry.dtype in AVERAGED:
            averaged.add(name)
        planned.append(
            PlannedTensor(name, (out_dtype or entry.dtype) if entry.dtype in AVERAGED else entry.dtype, entry.shape)
        )
    if kind == "adapter":
        return [("adapter_model.safetensors", plan_shards(planned, 1 << 62)[0])], averaged  # peft reads one file
    grouped = plan_shards(planned, max_shard_bytes)
    return list(zip(shard_file_names(len(grouped)), grouped, strict=True)), averaged


def _space(job: AverageJob) -> list[str]:
    """The output (and the momentum) must fit on the disk, with 1 % and 64 MB to spare."""
    needed = sum(t.nbytes for t in job.planned)
    if job.server:
        needed += job.server.moments * sum(4 * t.numel for t in job.planned if t.name in job.averaged)
    free = free_bytes(job.out)
    if needed * 1.01 + (64 << 20) <= free:
        return []
    return [
        f"--out {job.out}: the average needs about {needed / 1e9:.2f} GB and {free / 1e9:.2f} GB are free there; free some space or write elsewhere"
    ]


def _checkpoint_sizes(models: list[ModelInput]) -> list[str]:
    """Files of checkpoint inputs must have the sizes their manifest records (their sha256 is checked while averaging)."""
    problems = []
    for i, inp in enumerate(models):
        if inp.checkpoint is None:
            continue
        for path in inp.files:
            name = path.relative_to(inp.directory).as_posix()
            expected = inp.checkpoint.files.get(name)
            if expected is not None and path.stat().st_size != expected["size"]:
                problems.append(
                    f"{inp.label(i)}: {name} is {path.stat().st_size} bytes, its checkpoint manifest says {expected['size']}; "
                    "the checkpoint is damaged, average another one"
                )
                break
    return problems
