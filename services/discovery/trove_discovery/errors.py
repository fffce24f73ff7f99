"""Errors raised by trove_discovery.

    TroveError                   (trove_schema.errors)
    └── DiscoveryError           anything discovery refuses on purpose
        ├── InvalidURL           a URL Trove will not crawl; ``reason`` says why
        └── InvalidSeed          a seed message (or one of its options) is unusable

Both carry a ``reason`` written for the operator: it ends up in ``SeedRejected`` events
and in the reply to ``nats req trove.seeds ...``.
"""

from __future__ import annotations

from trove_schema.errors import TroveError


class DiscoveryError(TroveError):
    """Base of every error trove_discovery raises on purpose."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        #: Why, in words for the operator (e.g. "scheme 'ftp' is not http or https").
        self.reason = reason


class InvalidURL(DiscoveryError):
    """A URL Trove will not crawl: not http(s), no host, too long, a private address…"""


class InvalidSeed(DiscoveryError):
    """A seed message, or one of its options (priority, scope, pattern…), is unusable."""
