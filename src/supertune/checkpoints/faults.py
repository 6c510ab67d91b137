"""Named points where a test may kill the training process, to prove that no kill loses the run.

Test-only: SUPERTUNE_FAULT, SUPERTUNE_FAULT_ONCE and SUPERTUNE_FAULT_IN are for the test suite (and a
developer reproducing a kill), not settings of supertune; `--help` and the config reference name
none of them, and a run never needs one. Set outside a test, they kill the process named.

`SUPERTUNE_FAULT=<point>@<step>[:<rank>]` (for example `save.manifest@8`) makes the process of that
rank (default 0) kill itself with SIGKILL when it reaches the point at that optimizer step: no
handler, no cleanup, as when a node dies. Unset (always, outside tests) it costs one dictionary
lookup per point, a few per checkpoint.

Points, in the order a save passes them: save.begin, save.weights (model written, optimizer not
yet), save.staged (all files written, no manifest), save.manifest (manifest written, not yet
renamed into place), save.renamed (in place, `latest` not yet updated), save.published.
Outside saves: step (after an optimizer step), resume.loaded (a checkpoint was chosen and training
is about to continue from it), final.model (final model written, no summary yet).
Averaging (`supertune average`, where "step" counts tensors): average.tensor (that many tensors
averaged and written into the staging directory), average.written (every shard written, the output
not yet renamed into place). A transfer package (supertune.transfer): transfer.tensor (that many of
its stored tensors written into the staging directory). Evaluation: evaluate.batch (that many batches
of an exact eval loss computed: a run's final eval, a global model's on a site). A federation's
coordinator: federation.left_out (that many sites' left_out receipts of a round written). A site
agent with secure aggregation: secure.scales (at that round, its masked scales put on the exchange);
its coordinator: secure.summed (at that round, the scales' sum put on the exchange).

With `SUPERTUNE_FAULT_ONCE=<path>` the kill happens only if <path> does not exist yet (it is created
just before), so that processes restarted by torchrun with the same environment run through.
With `SUPERTUNE_FAULT_IN=<text>` it happens only in a process whose command line holds <text> (a
training worker's names its run directory: `round-002/site-b` kills one site's round of a federation).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["ENV", "ONCE_ENV", "IN_ENV", "fault_point"]

ENV = "SUPERTUNE_FAULT"
ONCE_ENV = "SUPERTUNE_FAULT_ONCE"
IN_ENV = "SUPERTUNE_FAULT_IN"


def fault_point(name: str, step: int, rank: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, where = spec.partition("@")
    at_step, _, at_rank = where.partition(":")
    if point == name and at_step == str(step) and (at_rank or "0") == str(rank):
        where = os.environ.get(IN_ENV)
        if where and where not in " ".join(sys.argv):
            return
        once = os.environ.get(ONCE_ENV)
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        os.kill(os.getpid(), signal.SIGKILL)
