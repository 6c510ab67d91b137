"""The scales of a sweep: devices -> nodes x devices per node, and the batch each scale trains with.

`--keep global-batch` (strong scaling) keeps the sequences per optimizer step of the smallest scale
(per_device_train_batch_size x devices x gradient_accumulation_steps there): at N devices each
takes G / N sequences per step, as the largest batch not above the config's per-device batch that
divides G / N, with gradient accumulation making up the rest (the rule of
training.global_batch_size, whose config key takes over when a config sets it). `--keep
per-device-batch` (weak scaling) keeps each device's batch and accumulation, so the global batch
grows with the devices. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

__all__ = ["KEEP_CHOICES", "Scale", "plan_scales", "scaling_kind", "split_batch"]

KEEP_CHOICES = ("global-batch", "per-device-batch")


@dataclass(frozen=True)
class Scale:
    """One run of a sweep."""

    devices: int
    nodes: int
    per_node: int
    """Processes (GPUs, or processes on CPU nodes) per node."""
    per_device_batch: int
    accumulation: int

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices * self.accumulation

    @property
    def name(self) -> str:
        """The run directory's name inside the sweep directory."""
        return f"devices-{self.devices}"


def scaling_kind(keep: str) -> str:
    """strong (the same work spread over more devices) or weak (more work, the same per device)."""
    return "strong" if keep == "global-batch" else "weak"


def split_batch(global_batch: int, devices: int, most_per_device: int) -> tuple[int, int] | str:
    """(per-device batch, accumulation) of `global_batch` sequences over `devices`, or the problem in words."""
    if global_batch % devices:
        return (
            f"{devices} devices: the global batch of {global_batch} sequences cannot be split over {devices} devices "
            f"({global_batch} / {devices} is not whole); give a device count that divides {global_batch}, or raise the "
            f"batch (training.per_device_train_batch_size or gradient_accumulation_steps) of the smallest scale"
        )
    from ..resolve.global_batch import split_global_batch

    return split_global_batch(global_batch, devices, most_per_device)  # whole now: the same split `resolve` makes


def plan_scales(
    devices: list[int],
    per_node: int | None,
    per_device_batch: int,
    accumulation: int,
    keep: str,
    global_batch: int | None = None,
) -> list[Scale]:
    """The runs of a sweep, smallest first; one UserError lists every scale that cannot be planned.

    per_node: devices a node holds (None: local processes, one node); global_batch: the config's
    training.global_batch_size when it sets one (else the smallest scale's)."""
    if keep not in KEEP_CHOICES:
        raise UserError(f"--keep: {keep!r} is not one of {', '.join(KEEP_CHOICES)}")
    counts = sorted(set(devices))
    problems = [f"{n} devices: must be at least 1" for n in counts if n < 1]
    counts = [n for n in counts if n >= 1]
    if not counts and not problems:
        problems.append("no device counts given")
    target = global_batch or (per_device_batch * counts[0] * accumulation if counts else 0)
    scales = []
    for n in counts:
        nodes, on_node = 1, n
        if per_node is not None and n > per_node:
            if n % per_node:
                below, above = n // per_node * per_node, (n // per_node + 1) * per_node
                problems.append(
                    f"{n} devices: nodes hold {per_node}, so {n} is not a whole number of nodes (use {below} or {above})"
                )
                continue
            nodes, on_node = n // per_node, per_node
        if keep == "global-batch":
            split = split_batch(target, n, per_device_batch)
            if isinstance(split, str):
                problems.append(split)
                continue
            batch, steps = split
        else:
            batch, steps = per_device_batch, accumulation
        scales.append(Scale(n, nodes, on_node, batch, steps))
    if problems:
        raise UserError("the sweep cannot run at every scale:\n" + "\n".join(f"  - {p}" for p in problems))
    return scales
