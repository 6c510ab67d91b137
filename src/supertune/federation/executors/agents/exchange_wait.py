"""Waiting at the exchange, for the coordinator and for a site's agent alike: ask once per poll
interval (each ask is one command on the exchange host), and say in the log once a minute what is
still awaited, so that a wait of hours shows it is alive without a line per poll. An outage of the
exchange (ExchangeUnreachable: it did not answer through the exchange's own retries, about 30 s) is
waited out OUTAGE_WAIT seconds at a time by a site's agent: its chain of jobs between two links
(agent_chain.py), an agent run by hand in its own process (site_agent.run_agent_through_outages)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_at_exchange", "OUTAGE_WAIT"]

log = logging.getLogger("supertune")
T = TypeVar("T")

OUTAGE_WAIT = 300
"""Seconds a site's agent waits after an outage of the exchange before it tries again: the exchange's
own retries have just waited 30 s, and an outage that outlasted them is more likely minutes than seconds."""


def wait_at_exchange(ask: Callable[[], T | None], poll_seconds: float, awaited: Callable[[], str]) -> T:
    """ask() once per `poll_seconds` until it answers something other than None; that answer."""
    since = said = time.monotonic()
    while (got := ask()) is None:
        if time.monotonic() - said >= 60:
            said = time.monotonic()
            log.info("waiting %.0f s for %s", said - since, awaited())
        time.sleep(poll_seconds)
    return got
