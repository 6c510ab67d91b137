"""The one module that reads the launch environment: who this process is in the job, and who said so."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchEnvironment", "launch_environment"]


@dataclass(frozen=True)
class LaunchEnvironment:
    """Rank, sizes and rendezvous address of the current process."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"
    """Which launcher's variables these came from: torchrun (also accelerate, deepspeed) or none."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launch_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read the variables torchrun-style launchers set; a plain process is rank 0 of 1."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        port = env.get("MASTER_PORT")
        return LaunchEnvironment(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env["WORLD_SIZE"]),
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(port) if port else None,
            launcher="torchrun",
        )
    return LaunchEnvironment()
