"""Waiting at the exchange, for the coordinator and for a site's agent alike: ask once per poll
interval (each ask is one command on the exchange host), and say in the log once a minute what is
still awaited, so that a wait of hours shows it is alive without a line per poll."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_at_exchange"]

log = logging.getLogger("supertune")
T = TypeVar("T")


def wait_at_exchange(ask: Callable[[], T | None], poll_seconds: float, awaited: Callable[[], str]) -> T:
    """ask() once per `poll_seconds` until it answers something other than None; that answer."""
    since = said = time.monotonic()
    while (got := ask()) is None:
        if time.monotonic() - said >= 60:
            said = time.monotonic()
            log.info("waiting %.0f s for %s", said - since, awaited())
        time.sleep(poll_seconds)
    return got
