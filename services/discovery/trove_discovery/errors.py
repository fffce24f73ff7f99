"""Errors raised by trove_discovery.

    TroveError                   (trove_schema.errors)
    ├── InvalidURL               a URL Trove will not crawl (trove_schema.errors, shared
    │                            with the fetcher and the recorder: URL identity is schema)
    └── DiscoveryError           anything discovery refuses on purpose
        ├── InvalidSeed          a seed message (or one of its options) is unusable
        └── InvalidFollow        a follow or unfollow command (or one of its options) is unusable

Both carry a ``reason`` written for the operator: it ends up in ``SeedRejected`` events
and in the reply to ``nats req trove.seeds ...`` (``trove.follow``, ``trove.unfollow``).
"""

from __future__ import annotations

from trove_schema.errors import InvalidURL, TroveError

__all__ = ["DiscoveryError", "InvalidFollow", "InvalidSeed", "InvalidURL"]


class DiscoveryError(TroveError):
    """Base of every error trove_discovery raises on purpose."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        #: Why, in words for the operator (e.g. "scheme 'ftp' is not http or https").
        self.reason = reason


class InvalidSeed(DiscoveryError):
    """A seed message, or one of its options (priority, scope, pattern…), is unusable."""


class InvalidFollow(DiscoveryError):
    """A follow or unfollow command, or one of its options (instance, timeline…), is unusable."""
