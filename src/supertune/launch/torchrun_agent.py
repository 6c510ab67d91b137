"""torchrun for the runs supertune starts on this machine, with its failure report cut to one line.

A worker that stops on a bad input prints its own one-line error and exits; torchrun then raises
ChildFailedError, and its traceback with a root-cause table (some 30 lines) would bury the line that
matters. This runs torchrun's own main unchanged and turns that exception into one line naming the
ranks that failed and their exit codes; the exit code is the first failure's, as the worker set it.
A worker's own traceback (a real crash) is still printed by the worker itself.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        ranks = ", ".join(f"rank {rank} exit {failure.exitcode}" for rank, failure in sorted(failed.failures.items()))
        print(f"supertune: training processes failed ({ranks}); their own messages are above", file=sys.stderr)
        _, first = failed.get_first_failure()
        return first.exitcode if 0 < first.exitcode < 256 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
