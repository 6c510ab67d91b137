"""Each process of a pre-flight: entry point `doctor-worker --comm [options]` of supertune.entry.

Started by torchrun (`supertune doctor --comm --nproc N`, or a job step under the torchrun,
accelerate or deepspeed launcher) or directly by srun, exactly like training's worker, so that the
pre-flight crosses the same network the training will. Exit codes: 0 no check failed, 1 a check
failed on some process (the bandwidth below --expect-gbps included), 2 wrong options.
"""

from __future__ import annotations

import argparse

from .options import add_doctor_arguments, options_from_args
from .run import run_doctor


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_doctor_arguments(p, with_nproc=False)


def run(args: argparse.Namespace) -> int:
    return run_doctor(options_from_args(args))
