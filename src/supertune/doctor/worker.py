"""Entry point of each process of a pre-flight: `python -m supertune.doctor.worker --comm [options]`.

Started by torchrun (`supertune doctor --comm --nproc N`, or a job step under the torchrun,
accelerate or deepspeed launcher) or directly by srun, exactly like supertune.train.worker, so
that the pre-flight crosses the same network the training will. Exit codes: 0 no check failed,
1 a check failed on some process (the bandwidth below --expect-gbps included), 2 wrong options.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from .options import WORKER_MODULE, add_doctor_arguments, options_from_args
from .run import run_doctor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}", description=__doc__.splitlines()[0])
    add_doctor_arguments(parser, with_nproc=False)
    args = parser.parse_args(argv)
    try:
        return run_doctor(options_from_args(args))
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
