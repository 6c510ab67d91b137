"""Rounds that go on without a site: after a site's training failed every attempt (`site_retries` +
1), or was still unfinished at the round's deadline (`round_deadline`), the round is averaged over the
sites that finished, if they are at least `aggregation.min_sites`; the site is left out of that round
only (a `left_out.json` receipt in its folder of the round, with the reason and the attempts), and
trains again in the next round from the new global model like every other site. The receipt is the
decision: a federation resumed after it averages the same sites. Below the quorum nothing is decided
and the round stops, to be run again (each unfinished site's run resumes from its latest checkpoint,
and the round gets a new deadline), or with `--skip-site NAME`, which leaves a site out of the next
round by the same receipt.
"""

from __future__ import annotations

import logging
import time

from ...checkpoints.faults import fault_point
from ...errors import UserError
from ..config.schema import FederationConfig
from ..state.layout import FederationDir
from ..state.receipts import read_receipt, write_left_out
from ..state.records import LeftOut
from .loop import RoundWork

__all__ = ["leave_out_failed_sites", "sites_needed", "skip_sites"]

log = logging.getLogger("supertune")


def sites_needed(fed: FederationConfig, work: RoundWork) -> int:
    """The sites a round's average needs: aggregation.min_sites, or every site training in it when empty."""
    quorum = fed.aggregation.min_sites
    return quorum if quorum is not None else len(work.trained)


def leave_out_failed_sites(
    fed: FederationConfig, work: RoundWork, failed: dict[str, tuple[str, int]], deadline: str | None = None
) -> None:
    """`failed`: site -> (reason, attempts) of the sites whose training failed, or was late, in this round
    (`deadline`: the round_deadline it was late for). With a quorum that the other sites meet, each such
    site gets its left_out receipt and leaves this round's average and evaluation; otherwise UserError
    saying how to go on (nothing is decided; a round with a deadline forgets its start)."""
    from ..state.layout import RoundDir
    from .deadline import forget_start

    quorum = fed.aggregation.min_sites
    finished = [name for name, receipt in work.trained.items() if name not in failed and read_receipt(receipt)]
    said = "; ".join(f"{name}: {reason} ({attempts} attempt{'s' if attempts != 1 else ''})"
                     for name, (reason, attempts) in failed.items())  # fmt: skip
    directory = work.averaged.parent.parent
    needed = sites_needed(fed, work)
    if len(finished) < needed:
        wanted = f"aggregation.min_sites={quorum}" if quorum is not None else "every site (aggregation.min_sites empty)"
        when = f" by its deadline (round_deadline {deadline})" if deadline else ""
        if deadline:
            forget_start(RoundDir(work.averaged.parent, work.number))
        raise UserError(
            f"round {work.number}: {len(finished)} of {len(work.trained)} sites finished training{when} and the round "
            f"needs {wanted}; {said}; run `supertune federate {directory}` again to go on (each unfinished site "
            f"resumes from its latest checkpoint{', with a new deadline' if deadline else ''}), or leave a site out of "
            f"this round with `supertune federate {directory} --skip-site NAME` (for good: --drop NAME)"
        )
    for written, (name, (reason, attempts)) in enumerate(failed.items(), start=1):
        site_dir = work.trained[name].parent
        write_left_out(site_dir / "left_out.json", LeftOut(name, work.number, reason, attempts, time.time()))
        fault_point("federation.left_out", written, 0)
        work.left_out[name] = reason
        del work.trained[name]
    work.evaluate = [w for w in work.evaluate if w.name not in failed]


def skip_sites(fed: FederationConfig, root: FederationDir, names: list[str]) -> None:
    """`--skip-site NAME`: leave each site out of the first round not yet averaged (that round only), by
    the same receipt as a site that failed; refused in one line, nothing written, for a name that is no
    site, a dropped site, a site not in that round, a finished federation, or a round left below its
    quorum (or with no site)."""
    from ..state.history import dropped_sites, first_unfinished_round

    known = [s.name for s in fed.sites]
    for name in names:
        if name not in known:
            raise UserError(f"--skip-site: {name!r} is not a site of this federation; its sites are {', '.join(known)}")
    if read_receipt(root.round(fed.rounds).averaged) is not None:
        raise UserError(f"--skip-site: the federation in {root.path} has finished all its {fed.rounds} rounds")
    number = first_unfinished_round(fed, root)
    rd = root.round(number)
    dropped = dropped_sites(root)
    present = [s.name for s in fed.sites if s.in_round(number) and s.name not in dropped]
    out = [s for s in present if read_receipt(rd.site(s).left_out) is not None]
    for name in names:
        if name not in present:
            why = "is dropped" if name in dropped else f"does not train in round {number} (from_round/until_round)"
            raise UserError(f"--skip-site: site {name} {why}; nothing to skip")
    left = [s for s in present if s not in out and s not in names]
    needed = max(1, fed.aggregation.min_sites or 1)
    if len(left) < needed:
        raise UserError(
            f"--skip-site: round {number} would keep {len(left)} site{'s' if len(left) != 1 else ''} "
            f"({', '.join(left) or 'none'}) and needs {needed} (aggregation.min_sites); skip fewer sites"
        )
    for name in dict.fromkeys(names):
        if name in out:
            continue
        write_left_out(rd.site(name).left_out, LeftOut(name, number, "skipped: --skip-site", 0, time.time()))
        log.warning(
            "site %s: left out of round %d (--skip-site); it trains again in round %d", name, number, number + 1
        )
