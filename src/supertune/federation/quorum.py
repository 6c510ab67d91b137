"""Rounds that go on without a failed site: after a site's training failed every attempt
(`site_retries` + 1), the round is averaged over the sites that finished, if they are at least
`aggregation.min_sites`; the failed site is left out of that round only (a `left_out.json` receipt
in its folder of the round, with the reason and the attempts), and trains again in the next round
from the new global model like every other site. The receipt is the decision: a federation resumed
after it averages the same sites. Below the quorum nothing is decided and the round stops, to be
run again (each failed site's run resumes from its latest checkpoint).
"""

from __future__ import annotations

import time

from ..errors import UserError
from .receipts import read_receipt, write_receipt
from .rounds import RoundWork
from .schema import FederationConfig

__all__ = ["leave_out_failed_sites"]


def leave_out_failed_sites(fed: FederationConfig, work: RoundWork, failed: dict[str, tuple[str, int]]) -> None:
    """`failed`: site -> (reason, attempts) of the sites whose training failed in this round. With a
    quorum that the other sites meet, each failed site gets its left_out receipt and leaves this round's
    average and evaluation; otherwise UserError saying how to go on (nothing is written)."""
    quorum = fed.aggregation.min_sites
    finished = [name for name, receipt in work.trained.items() if name not in failed and read_receipt(receipt)]
    said = "; ".join(f"{name}: {reason} ({attempts} attempt{'s' if attempts != 1 else ''})"
                     for name, (reason, attempts) in failed.items())  # fmt: skip
    directory = work.averaged.parent.parent
    if quorum is None or len(finished) < quorum:
        wanted = f"aggregation.min_sites={quorum}" if quorum is not None else "every site (aggregation.min_sites empty)"
        raise UserError(
            f"round {work.number}: {len(finished)} of {len(work.trained)} sites finished training and the round needs "
            f"{wanted}; {said}; run `supertune federate {directory}` again to retry them (each resumes from its latest "
            f"checkpoint), or drop a site for good with --drop"
        )
    for name, (reason, attempts) in failed.items():
        site_dir = work.trained[name].parent
        record = {"site": name, "round": work.number, "reason": reason, "attempts": attempts, "unix": time.time()}
        write_receipt(site_dir / "left_out.json", record)
        work.left_out[name] = reason
        del work.trained[name]
    work.evaluate = [w for w in work.evaluate if w.name not in failed]
