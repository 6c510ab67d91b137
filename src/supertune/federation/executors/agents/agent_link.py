"""Entry point `agent-link`: what one link of a site agent's chain of SLURM jobs runs (agent_chain.py).

agent-link SITE EXCHANGE --dir DIR                  the site's agent, until the federation ends (exit
                                                    OUTAGE_EXIT when the exchange stays unreachable)
agent-link SITE EXCHANGE --dir DIR --next --cluster C --time T [--partition P]
                                                    the next link, submitted as `--submit` submits
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("site", metavar="SITE", help="the site whose agent this is")
    p.add_argument("exchange", metavar="EXCHANGE", help="the exchange: a directory or ssh://[user@]host[:port]/path")
    p.add_argument("--dir", required=True, help="the agent's directory")
    p.add_argument("--next", action="store_true", help="submit the next link instead of running the agent")
    p.add_argument("--cluster", help="with --next: the cluster profile")
    p.add_argument("--time", help="with --next: the link's time limit")
    p.add_argument("--partition", help="with --next: the link's partition")


def run(args: argparse.Namespace) -> int:
    if args.next:
        from .agent_chain import plan_chain, render_chain_script, submit_chain

        chain, profile = plan_chain(args.site, args.exchange, args.dir, args.cluster, args.time, args.partition)
        job_id = submit_chain(chain, render_chain_script(chain, profile))
        print(f"supertune: site {args.site}: submitted job {job_id}, the next link of the agent's chain", flush=True)
        return 0
    from ....exchange import ExchangeUnreachable
    from ....train.lifecycle.logging_setup import setup_logging
    from .agent_chain import OUTAGE_EXIT
    from .site_agent import run_agent

    setup_logging()
    try:
        ended = run_agent(args.site, args.exchange, args.dir)
    except ExchangeUnreachable as exc:  # an outage: the link script waits and submits the next link
        print(f"supertune: error: {exc}", file=sys.stderr, flush=True)
        return OUTAGE_EXIT
    print(f"supertune: {ended.said}", flush=True)  # every round done, or the site dropped: the chain ends
    return 0
