"""A federation's exchange: a directory, here or on a host reached over ssh, that sites and the
coordinator put files into and get files from, whole, verified and resumable (files.py); and how
fast a link to it is (link_check.py, `supertune doctor --exchange`)."""

from .address import ExchangeAddress, parse_exchange
from .files import Exchange, ExchangeUnreachable

__all__ = ["Exchange", "ExchangeUnreachable", "ExchangeAddress", "parse_exchange"]
