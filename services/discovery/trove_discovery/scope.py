"""Scope: may a crawl that started at a seed go on to this URL?

``HOST`` keeps to the seed's host and its ``www.`` twin (``example.org`` and
``www.example.org`` are one site to most people), whatever the port. ``DOMAIN`` keeps
to the seed's registrable domain (``blog.example.co.uk`` and ``shop.example.co.uk`` are
both ``example.co.uk``). ``PATTERN`` searches the canonical URL with the seed's regular
expression. ``OPEN`` is the open web. Depth applies to every kind.

Patterns are matched by RE2 (google-re2), not by ``re``: an operator's pattern runs on
every link found, and a backtracking engine takes exponential time on a pattern like
``^(a+)+$`` against a long link, which would stall discovery. RE2 matches in time
linear in the URL's length; it has Python's syntax for the common subset and refuses
what needs backtracking (backreferences, lookaround), so such a pattern is refused when
the seed is sent (``pattern_error``), with the reason.

URLs are expected canonical (``normalize.canonicalize``); one without a host is out of
every scope but ``OPEN``, and so is everything when a pattern does not compile.
"""

from __future__ import annotations

import functools
import posixpath
import re
from typing import Protocol
from urllib.parse import urlsplit

import re2  # type: ignore[import-untyped]

from trove_discovery.errors import InvalidURL
from trove_schema.aliases import INDEX_NAMES
from trove_schema.events import MAX_SCOPE_MOVES, Scope, ScopeKind
from trove_schema.urls import domain_of, registrable_domain

#: Extensions that make a path's last segment a file (a page, a feed, a script's
#: action), whose directory is the site. Any other dot is part of a name
#: (``/john.doe``): a platform's user, whose subtree is the site, not the platform's
#: root; and so is a segment that starts as a user's does (``/@ann.lee``, ``/~ann.lee``).
PAGE_EXTENSIONS = frozenset(
    {posixpath.splitext(name)[1] for name in INDEX_NAMES}
    | {".html", ".htm", ".xhtml", ".shtml", ".phtml", ".php", ".asp", ".aspx", ".jsp"}
    | {".jsf", ".faces", ".do", ".action", ".cgi", ".pl", ".py", ".cfm", ".cfml", ".nsf"}
    | {".xml", ".rss", ".atom", ".json", ".txt"}
)


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


def redirected_scope(scope: Scope, target: str) -> Scope | None:
    """The scope of a page named directly (a seed, a shared link: depth 0) that
    redirects to ``target`` outside ``scope``, or None when the redirect stays out.

    The operator (or the post) named the page, not its host: a seed that answers at
    another address (``blog.example.org`` -> ``example.org/blog/``, a site that moved,
    a shortened link shared on the fediverse) is crawled where it answers. A ``HOST``
    or ``DOMAIN`` scope becomes a ``PATTERN`` of the target's host (and its ``www.``
    twin, any port) and the target's subtree (its directory when its path ends in
    ``/`` or names a page file, ``PAGE_EXTENSIONS``, else the path itself and what lies
    under it: ``/@ann``, ``/@ann.lee``, ``/view/x``): not the target's whole host or
    domain, which may be a platform of many sites (``sites.google.com/view/x``). It
    moves again with the next redirect of the chain (a shortener to a shortener), up to
    ``MAX_SCOPE_MOVES``; an operator's own pattern never moves.
    """
    moved = scope.kind is ScopeKind.PATTERN and scope.moves > 0
    if scope.kind not in (ScopeKind.HOST, ScopeKind.DOMAIN) and not moved:
        return None
    if scope.moves >= MAX_SCOPE_MOVES:
        return None
    try:
        parts = urlsplit(target)
        host = domain_of(target)
    except (InvalidURL, ValueError):
        return None
    if ":" in host:  # an IPv6 literal, in brackets in a URL
        origin = rf"\[{re.escape(host)}\]"
    else:
        origin = rf"(?:www\.)?{re.escape(_without_www(host))}"
    path = parts.path or "/"
    name = path[path.rfind("/") + 1 :]
    named = name.startswith(("@", "~"))
    if not named and posixpath.splitext(name)[1].lower() in PAGE_EXTENSIONS:  # ``index.html``
        path = path[: path.rfind("/") + 1]
    subtree = re.escape(path) + ("" if path.endswith("/") else "(?:[/?#]|$)")
    pattern = rf"^https?://{origin}(?::[0-9]+)?{subtree}"
    return scope.model_copy(
        update={"kind": ScopeKind.PATTERN, "value": pattern, "moves": scope.moves + 1}
    )


def follow_link(link_url: str, *, depth: int, scope: Scope) -> bool:
    """Should a link found on a page at ``depth`` be followed? Its own depth is depth+1."""
    return depth + 1 <= scope.max_depth and in_scope(link_url, scope)


def _without_www(host: str) -> str:
    # "www.com" keeps its www: a bare TLD is nobody's twin.
    if host.startswith("www.") and "." in host[4:]:
        return host[4:]
    return host


class _Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


def _options() -> re2.Options:
    options = re2.Options()
    # A bad pattern is reported to the operator, not logged to stderr by the C++ library.
    options.log_errors = False
    # Only "does it match" is asked: no submatch to track.
    options.never_capture = True
    return options


_OPTIONS = _options()


def pattern_error(pattern: str) -> str | None:
    """Why RE2 cannot use ``pattern`` (for the operator), or None when it can."""
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        return str(detail) or "does not compile"
    return None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> _Pattern | None:
    # Seeds validate their pattern; one that still fails (an event from elsewhere, or
    # from before patterns were matched by RE2) closes the scope rather than crashing
    # the consumer on every link.
    try:
        compiled: _Pattern = re2.compile(pattern, _OPTIONS)
    except re2.error:
        return None
    return compiled
