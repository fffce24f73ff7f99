"""Scope: may a crawl that started at a seed go on to this URL?

``HOST`` keeps to the seed's host and its ``www.`` twin (``example.org`` and
``www.example.org`` are one site to most people), whatever the port. ``DOMAIN`` keeps
to the seed's registrable domain (``blog.example.co.uk`` and ``shop.example.co.uk`` are
both ``example.co.uk``). ``PATTERN`` is ``re.search`` of the seed's regular expression
on the canonical URL. ``OPEN`` is the open web. Depth applies to every kind.

URLs are expected canonical (``normalize.canonicalize``); one without a host is out of
every scope but ``OPEN``, and so is everything when a pattern does not compile.
"""

from __future__ import annotations

import functools
import re

from trove_discovery.errors import InvalidURL
from trove_schema.events import Scope, ScopeKind
from trove_schema.urls import domain_of, registrable_domain


def in_scope(url: str, scope: Scope) -> bool:
    """True when the canonical ``url`` lies inside ``scope`` (depth aside)."""
    if scope.kind is ScopeKind.OPEN:
        return True
    if scope.kind is ScopeKind.PATTERN:
        pattern = _compiled(scope.value)
        return pattern is not None and pattern.search(url) is not None
    try:
        host = domain_of(url)
    except InvalidURL:
        return False
    if scope.kind is ScopeKind.HOST:
        return _without_www(host) == _without_www(scope.value.lower())
    return registrable_domain(host) == scope.value.lower()


def follow_link(link_url: str, *, depth: int, scope: Scope) -> bool:
    """Should a link found on a page at ``depth`` be followed? Its own depth is depth+1."""
    return depth + 1 <= scope.max_depth and in_scope(link_url, scope)


def _without_www(host: str) -> str:
    # "www.com" keeps its www: a bare TLD is nobody's twin.
    if host.startswith("www.") and "." in host[4:]:
        return host[4:]
    return host


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    # Seeds validate their pattern; one that still fails (an event from elsewhere)
    # closes the scope rather than crashing the consumer on every link.
    try:
        return re.compile(pattern)
    except re.error:
        return None
