"""training.global_batch_size: the same sequences per optimizer step at any process count.

The rule, for G sequences per step over W processes: each process takes G / W sequences per step
(W must divide G); its batch per forward pass is the largest number b not above
training.per_device_train_batch_size that divides G / W, and gradient_accumulation_steps is
G / (W x b). With G = 16 and at most 8 per process: 1 process runs 8 x 2 accumulation steps,
2 run 8 x 1, 4 run 4 x 1, 16 run 1 x 1. The largest b wastes no forward pass on a partial batch
and keeps accumulation (one more forward pass per step each) as low as the memory cap allows.

Where it happens: when a run is created, for the process count its config plans
(`planned_world_size`), so that config.yaml says what will run; then again in every training
process against the world size the launch really gave (`fit_global_batch`), which derives it
anew, with a warning, when the two differ.
"""

from __future__ import annotations

import dataclasses
import logging

from ..clusters.schema import ClusterProfile
from ..config.errors import ConfigError
from ..config.schema import RunConfig

__all__ = ["split_global_batch", "planned_world_size", "with_global_batch", "fit_global_batch"]

log = logging.getLogger("supertune")


def split_global_batch(global_batch: int, world_size: int, most_per_device: int) -> tuple[int, int]:
    """(per-device batch, accumulation steps) of `global_batch` over `world_size` processes; a
    ConfigError with the numbers when no whole split exists."""
    if global_batch % world_size:
        below, above = global_batch - global_batch % world_size, global_batch + world_size - global_batch % world_size
        raise ConfigError([
            f"training.global_batch_size: {global_batch} sequences cannot be split over {world_size} processes "
            f"({global_batch} / {world_size} is not whole); use a multiple of {world_size} "
            f"({', '.join(str(n) for n in (below, above) if n > 0)}) or another process count"
        ])  # fmt: skip
    share = global_batch // world_size
    # Down from the cap: the first divisor found is the largest (validation bounds both numbers, so
    # this looks at most 2**20 candidates).
    per_device = next(b for b in range(min(most_per_device, share), 0, -1) if share % b == 0)
    return per_device, share // per_device


def planned_world_size(cfg: RunConfig, profile: ClusterProfile | None) -> int:
    """The processes a config plans: launch.nproc above 1 (`supertune train --nproc N`), else its
    SLURM job's (launch.nodes x processes per node, as `supertune submit` computes them)."""
    if cfg.launch.nproc > 1:
        return cfg.launch.nproc
    from ..slurm.job import job_spec

    return job_spec(cfg, profile or ClusterProfile(), run_dir="", python="").world_size


def with_global_batch(cfg: RunConfig, world_size: int) -> RunConfig:
    """`cfg` with per_device_train_batch_size and gradient_accumulation_steps derived from
    training.global_batch_size for `world_size` processes (unchanged when it is not set)."""
    t = cfg.training
    if t.global_batch_size is None:
        return cfg
    per_device, accumulation = split_global_batch(t.global_batch_size, world_size, t.per_device_train_batch_size)
    training = dataclasses.replace(t, per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    return dataclasses.replace(cfg, training=training)


def fit_global_batch(cfg: RunConfig, world_size: int) -> RunConfig:
    """In a training process: the config's split checked against the real world size, derived anew
    (with a warning) when config.yaml was written for another process count; the split is logged."""
    t = cfg.training
    if t.global_batch_size is None:
        return cfg
    if t.per_device_train_batch_size * t.gradient_accumulation_steps * world_size == t.global_batch_size:
        fitted = cfg
    else:
        fitted = with_global_batch(cfg, world_size)
        log.warning(
            "training.global_batch_size: config.yaml's split (%d per process x %d accumulation) was made for another "
            "process count; this run has %d processes: split again",
            t.per_device_train_batch_size,
            t.gradient_accumulation_steps,
            world_size,
        )
    f = fitted.training
    log.info(
        "global batch %d sequences (training.global_batch_size) = %d per process x %d process(es) x %d accumulation step(s)",
        f.global_batch_size,
        f.per_device_train_batch_size,
        world_size,
        f.gradient_accumulation_steps,
    )
    return fitted
