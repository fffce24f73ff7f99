"""URL identity shared by every service: the canonical form is the key of a page."""

from __future__ import annotations

from urllib.parse import urlsplit


def domain_of(url: str) -> str:
    """The politeness key of a URL: its lower-case host (without port)."""
    return (urlsplit(url).hostname or "").rstrip(".").lower()
