"""Turning one attempt into its ``CrawlCompleted``: always built, always within budget.

Whatever a site sends, an attempt ends in a recorded outcome. A page that makes
building the event fail (a value pydantic refuses, a bug nobody foresaw) is recorded
as ``rejected`` with the reason instead: an exception here would hand the work
message back, and every redelivery would fetch the page again.

An event must also fit in one stream message (``TROVE_MAX_MESSAGE_BYTES``): 1,000
links of 1,900 characters are ~2 MB of JSON. ``fit`` drops links from the end (the
rest keep document order) until the event fits, and sets ``links_truncated``; if the
event is still too big without links, the page's other extracted fields go too.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

from pydantic import TypeAdapter

from trove_fetcher.extract import Extraction, FoundLink, x_robots_directives
from trove_fetcher.http import FetchResult
from trove_fetcher.robots import BOT_NAME, RobotsPolicy
from trove_schema.events import (
    MAX_LINKS_PER_PAGE,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    LinkKind,
    PageDiscovered,
    attempt_id,
)
from trove_schema.heuristics import is_challenge
from trove_schema.policy import moved_url
from trove_schema.urls import canonicalize_or_none, domain_of

log = logging.getLogger("trove.fetcher")

Work = PageDiscovered | CrawlRequested

#: Room left in a stream message for the headers (ids, type) beside the event's JSON.
HEADERS_ROOM = 4096
_REASON_LENGTH = 2000
#: How the reason of an attempt whose body its strategy could not read begins.
EXTRACTION_FAILED = "extraction failed"
#: Why a challenge answered with a 2xx is not a success.
CHALLENGE_MESSAGE = "a bot challenge, not the page"


def event_budget(max_message_bytes: int) -> int:
    """Bytes of JSON a ``CrawlCompleted`` may take in a stream of ``max_message_bytes``."""
    return max_message_bytes - HEADERS_ROOM


def _base(
    work: Work, strategy: str, strategy_reason: str | None, conditional: bool
) -> dict[str, object]:
    return {
        "url": work.url,
        # Today's rule, not the work's field: a re-crawl chain carries its domain on
        # from this event, and one its first event spelled otherwise (before a rule of
        # ``domain_of`` changed) is put right here, for the policy, the URL rules and
        # the budgets to file what the host taught under its one name.
        "domain": domain_of(work.url),
        "depth": work.depth,
        "priority": work.priority,
        "scope": work.scope,
        "attempt": work.attempt if isinstance(work, CrawlRequested) else 1,
        "request_id": work.id,
        "id": attempt_id(work.id),
        # Which strategy asked, and why: what the audit and the learned policy read.
        "fetcher": strategy,
        "strategy_reason": strategy_reason,
        "conditional": conditional,
        # A re-crawl's change history goes on to the discovery that plans the next one.
        "history": work.history if isinstance(work, CrawlRequested) else None,
    }


def robots_refusal(
    work: Work,
    robots: RobotsPolicy,
    *,
    strategy: str = "http",
    strategy_reason: str | None = None,
    url: str | None = None,
    token: str = BOT_NAME,
) -> CrawlCompleted:
    """The site's robots.txt forbids the URL; or it could not be read, so nothing is
    allowed for now: that is a failed (retryable) attempt, not the site's refusal.

    A ``url`` refused because judging it would cost too much (``RobotsPolicy.unjudged``)
    is blocked by robots.txt too, and says so: a retry would meet the same file."""
    now = datetime.now(UTC)
    unjudged = None if url is None else robots.unjudged(url, token)
    if robots.temporary:
        status = f" ({robots.status_code})" if robots.status_code else ""
        outcome = CrawlOutcome.FAILED
        reason = f"robots.txt unavailable{status}: {robots.error or 'disallow all for now'}"
    else:
        outcome, reason = CrawlOutcome.BLOCKED_ROBOTS, unjudged or "disallowed by robots.txt"
    return CrawlCompleted(
        **_base(work, strategy, strategy_reason, False),
        outcome=outcome,
        error_message=reason[:_REASON_LENGTH],
        started_at=now,
        completed_at=now,
    )


def moved_away(work: Work, origin: str) -> CrawlCompleted:
    """The page's host moved to ``origin`` (its learned policy): no request was sent, and
    the page at its new address goes on as the target of a redirect the host would
    have answered."""
    now = datetime.now(UTC)
    target = canonicalize_or_none(moved_url(work.url, origin))
    links = [] if target is None else [{"url": target, "kind": LinkKind.REDIRECT}]
    return CrawlCompleted(
        **_base(work, "http", None, False),
        outcome=CrawlOutcome.REJECTED,
        error_message=f"not asked: the host moved to {origin}"[:_REASON_LENGTH],
        started_at=now,
        completed_at=now,
        links=links,
    )


def rejected(
    work: Work,
    reason: str,
    started: datetime,
    result: FetchResult | None = None,
    *,
    strategy: str = "http",
    strategy_reason: str | None = None,
    conditional: bool = False,
    excluded: bool = False,
) -> CrawlCompleted:
    """The attempt cannot be recorded as it went: ``rejected``, with the reason;
    ``excluded``: by the operator's exclusions (``CrawlCompleted.excluded``)."""
    status = result.status_code if result is not None else None
    return CrawlCompleted(
        **_base(work, strategy, strategy_reason, conditional),
        outcome=CrawlOutcome.REJECTED,
        status_code=status if isinstance(status, int) and 100 <= status <= 999 else None,
        error_message=reason[:_REASON_LENGTH],
        started_at=started,
        completed_at=datetime.now(UTC),
        excluded=excluded,
    )


def unreadable(
    work: Work,
    error: Exception,
    started: datetime,
    result: FetchResult,
    *,
    strategy: str = "http",
    strategy_reason: str | None = None,
    conditional: bool = False,
) -> CrawlCompleted:
    """The strategy could not read the body it fetched (extraction raised): ``rejected``,
    with a reason starting "extraction failed" and the exception's name (the audit calls
    a reader's ``NotActivityStreams`` ``wrong_tool``, anything else ``rejected``)."""
    return rejected(
        work,
        f"{EXTRACTION_FAILED}: {type(error).__name__}: {error}",
        started,
        result,
        strategy=strategy,
        strategy_reason=strategy_reason,
        conditional=conditional,
    )


def completed(
    work: Work,
    result: FetchResult,
    extraction: Extraction | None,
    started: datetime,
    *,
    strategy: str = "http",
    strategy_reason: str | None = None,
    conditional: bool = False,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token, not a secret
) -> CrawlCompleted:
    """The attempt's event (``fit`` it before publishing). Never raises for what a site sent.

    ``strategy`` is the fetch strategy's name (``CrawlCompleted.fetcher``), and
    ``strategy_reason`` why it was chosen; ``conditional`` says the request carried
    validators; ``robots_token`` names the crawler an X-Robots-Tag may aim at.
    """
    base = _base(work, strategy, strategy_reason, conditional)
    try:
        return _completed(base, work, result, extraction, started, robots_token)
    except Exception as exc:
        log.exception("could not build the event of %s", work.url, extra={"url": work.url})
        return rejected(
            work,
            f"could not record the response: {exc}",
            started,
            result,
            strategy=strategy,
            strategy_reason=strategy_reason,
            conditional=conditional,
        )


def with_canonical_links(extraction: Extraction) -> Extraction:
    """``extraction`` with its links canonical, one a URL and kind (nofollow only if
    every copy was, as ``extract`` keeps them), those that have no canonical form
    dropped; its canonical URL too.

    Pure Python, and slow on long queries and international names (a thousand links of
    2,000 characters: seconds): the fetcher runs it in the parse thread with the
    extraction (``Fetcher._extract``), not on the event loop, where it stopped every
    lease, timer and request of the pod meanwhile."""
    if extraction.links_canonical:
        return extraction
    canonical: dict[tuple[str, LinkKind], bool] = {}
    for found in extraction.links:
        url = canonicalize_or_none(found.url)
        if url is not None and canonical.get((url, found.kind), True):
            canonical[(url, found.kind)] = found.nofollow
    links = tuple(FoundLink(url, kind, nofollow) for (url, kind), nofollow in canonical.items())
    canonical_url = canonicalize_or_none(extraction.canonical_url or "")
    return replace(extraction, links=links, canonical_url=canonical_url, links_canonical=True)


def _completed(
    base: dict[str, object],
    work: Work,
    result: FetchResult,
    extraction: Extraction | None,
    started: datetime,
    robots_token: str,
) -> CrawlCompleted:
    outcome, message = result.outcome, result.error_message
    if outcome is CrawlOutcome.SUCCESS and is_challenge(
        result.status_code, result.response_headers
    ):
        # A challenge sent with a 2xx (Cloudflare's 200, AWS WAF's 202) is not the page:
        # its title, links and hash stay out of the record and of discovery, and the
        # audit reads it as the challenge it is (the host left alone).
        outcome, message, extraction = CrawlOutcome.BLOCKED_4XX, CHALLENGE_MESSAGE, None
    # Links as plain dicts: pydantic validates them in one go, in Rust, when the event is
    # built (~1 us a link; model_construct, in Python, takes ~3.5).
    links: list[dict[str, object]] = []
    truncated = False
    extra: dict[str, object] = {}
    if extraction is not None:
        extraction = with_canonical_links(extraction)
        links = [
            {"url": found.url, "kind": found.kind, "nofollow": found.nofollow}
            for found in extraction.links
        ]
        truncated = extraction.links_truncated
        extra = {
            "title": extraction.title,
            "language": extraction.language,
            "keywords": extraction.keywords,
            "content_hash": extraction.content_hash,
            "canonical_url": extraction.canonical_url,
            "noindex": extraction.noindex,
            "nofollow": extraction.nofollow,
            "text_chars": extraction.text_chars,
            "shell": extraction.shell,
        }
    if result.redirect_target:
        target = canonicalize_or_none(result.redirect_target)
        if target is not None:
            links = [*links[: MAX_LINKS_PER_PAGE - 1], {"url": target, "kind": LinkKind.REDIRECT}]
    final_url = result.final_url if result.final_url and result.final_url != work.url else None
    if outcome is CrawlOutcome.NOT_MODIFIED:
        # A 304 has no body to read, but the X-Robots-Tag it carries speaks for the page:
        # a site that starts saying noindex (nginx's add_header sends it with a 304 too)
        # while the page stays the same answers 304 at every visit, for months.
        extra["noindex"] = x_robots_directives(result.x_robots_tag, robots_token)[0]
    etag, last_modified = result.etag, result.last_modified
    if outcome is CrawlOutcome.NOT_MODIFIED and isinstance(work, CrawlRequested):
        # A 304 need not repeat the validators it answered (RFC 9110 15.4.5; most leave
        # Last-Modified out): they still name the page, so the next visit sends them
        # again rather than reading it whole every other time.
        etag, last_modified = etag or work.etag, last_modified or work.last_modified
    return CrawlCompleted(
        **base,
        outcome=outcome,
        status_code=result.status_code,
        error_message=message,
        started_at=started,
        completed_at=datetime.now(UTC),
        retry_after=result.retry_after,
        content_type=result.content_type,
        content_length=len(result.body) if result.body is not None else result.bytes_read,
        final_url=final_url,
        moved=final_url is not None and result.permanent,
        links=links,
        links_truncated=truncated,
        etag=etag,
        last_modified=last_modified,
        response_headers=result.response_headers,
        duration_ms=result.duration_ms,
        **extra,
    )


_LINK = TypeAdapter(Link)


def _link_bytes(link: Link) -> int:
    return len(_LINK.dump_json(link)) + 1  # and its comma


#: Most bytes one character takes in JSON (a control character is ``\u001f``).
_CHAR_BYTES = 6
#: A bound on everything but the links and keywords: a dozen text fields of at most
#: 2,048 characters each, at six bytes a character.
_OTHER_FIELDS_BOUND = 160 * 1024


def _size_bound(event: CrawlCompleted) -> int:
    """An upper bound on the event's JSON size, without serializing it (most events are a
    hundredth of the budget: measuring each exactly would serialize every event twice)."""
    links = sum(len(link.url) for link in event.links) * _CHAR_BYTES + 64 * len(event.links)
    keywords = sum(len(k) + 3 for k in event.keywords) * _CHAR_BYTES
    sitemaps = sum(len(url) + 3 for url in event.sitemaps) * _CHAR_BYTES
    return links + keywords + sitemaps + len(event.scope.value) * _CHAR_BYTES + _OTHER_FIELDS_BOUND


def fit(event: CrawlCompleted, budget: int) -> CrawlCompleted:
    """``event``, or a copy cut to fit in ``budget`` bytes of JSON (links from the end)."""
    if _size_bound(event) <= budget:
        return event
    size = len(event.to_wire())
    if size <= budget:
        return event
    links = event.links
    keep = len(links)
    excess = size - budget
    while keep > 0 and excess > 0:
        keep -= 1
        excess -= _link_bytes(links[keep])
    while True:
        cut = event.model_copy(update={"links": links[:keep], "links_truncated": True})
        size = len(cut.to_wire())
        if size <= budget:
            log.warning(
                "links cut to fit the event in %d bytes",
                budget,
                extra={"url": event.url, "kept": keep, "links": len(links)},
            )
            return cut
        if keep == 0:
            break
        keep -= 1
    # Not the links: the other fields a site controls make it too big. Keep the outcome.
    bare = cut.model_copy(
        update={
            "title": None,
            "keywords": (),
            "sitemaps": (),
            "canonical_url": None,
            "final_url": None,
            "content_type": None,
            "response_headers": {},
            "etag": None,
            "last_modified": None,
            "error_message": "event over its size budget: page signals left out",
        }
    )
    log.warning("event over its size budget without links", extra={"url": event.url})
    return bare
