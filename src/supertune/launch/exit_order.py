"""Leaving a job on several nodes in an order torchrun's agents survive.

The torchrun agent of the first node hosts the store where the agents of all nodes meet when their
processes have ended. If another node's agent gets there last, the first one may already have left
with its store, and that agent logs a traceback in a job that succeeded (pytorch/pytorch#69520;
seen here with accelerate on two nodes). So the first node's processes end last: a few seconds
after the others, enough for their agents to see them end and check in (they poll every 0.1 s).
Training and the doctor's pre-flight both end this way.
"""

from __future__ import annotations

import time

from .environment import LaunchEnvironment

__all__ = ["leave_in_order", "EXIT_GRACE_S"]

EXIT_GRACE_S = 5.0


def leave_in_order(view: LaunchEnvironment) -> None:
    """On several nodes under torchrun agents: all processes finish together, the first node's last."""
    if not (view.elastic_agent and view.num_nodes > 1):
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if view.node_rank == 0:
        time.sleep(EXIT_GRACE_S)
